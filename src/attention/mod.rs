//! attn
