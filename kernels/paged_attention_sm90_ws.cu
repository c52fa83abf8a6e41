// Placeholder: filled in by the paged_attention_sm90_ws work.
