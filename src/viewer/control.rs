//! Messages from the viewer's controls to whatever runs the stream (the pipeline's control
//! channel). Kept to what a user can ask for; the pipeline decides how.

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ViewerControl {
    Pause(bool),
    /// Clear the cache and start the reconstruction over.
    Reset,
    /// Paged attention (true) or the dense baseline (false).
    PagedAttention(bool),
    SlidingWindow(usize),
    KeyframeInterval(u32),
    Recording(bool),
}
