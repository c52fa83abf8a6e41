//! What the cache tells the UI and the recorder: events of each step and a stats snapshot.

use serde::Serialize;

/// Which stream a resident frame's patch pages belong to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PatchStream {
    Scale,
    Window,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum CacheEvent {
    /// A frame's patch tokens got pages. `transient` frames (non-keyframes) are rolled back.
    FrameAppended {
        frame: u64,
        stream: PatchStream,
        pages: Vec<u32>,
        transient: bool,
    },
    /// A window frame left the cache; its patch pages went back to the free list (its special
    /// tokens stay in the trajectory memory).
    FrameEvicted {
        frame: u64,
        pages: Vec<u32>,
    },
    /// A non-keyframe (or an aborted step) was undone.
    RolledBack {
        frames: Vec<u64>,
    },
    SpecialPageOpened {
        page: u32,
    },
    /// A page id was created for the first time: host storage grows to hold it.
    PoolGrown {
        allocated_pages: usize,
        max_pages: usize,
    },
    /// The drop-oldest policy forgot the oldest special page.
    SpecialPageDropped {
        page: u32,
        tokens: u32,
    },
    Reset,
}

/// A snapshot of the cache for panels and logs; cheap to make.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CacheStats {
    pub page_size: usize,
    pub scale_pages: usize,
    pub window_pages: usize,
    pub special_pages: usize,
    /// Pages allocated and holding nothing (patch pool and grown special pool).
    pub free_pages: usize,
    /// Page ids that exist (patch pool + special pages grown so far).
    pub allocated_pages: usize,
    /// The cap on page ids (what a static plan preallocates).
    pub max_pages: usize,
    pub bytes_allocated: u64,
    pub bytes_resident: u64,
    /// Tokens resident for attention now (padding excluded).
    pub tokens_visible: u64,
    pub frames_committed: u64,
    pub live_frames: usize,
    pub special_tokens: u64,
    pub special_tokens_dropped: u64,
    pub frames_evicted: u64,
}

/// One cell of the page map panel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum PageState {
    Free,
    Scale {
        frame: u64,
    },
    Window {
        frame: u64,
    },
    /// A non-keyframe's borrowed page.
    Transient {
        frame: u64,
    },
    Special {
        tokens: u32,
    },
}
