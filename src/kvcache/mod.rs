//! kv
