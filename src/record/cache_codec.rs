//! The cache snapshot in the file. The kvcache types serialize but do not deserialize (they are
//! the cache's own, made for the UI), so the file goes through these mirrors. The conversions
//! match exhaustively both ways: a new event kind fails to compile here instead of vanishing
//! from recordings.

use serde::{Deserialize, Serialize};

use crate::frame::CacheSnapshot;
use crate::kvcache::{CacheEvent, CacheStats, PageState, PatchStream};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum StreamRec {
    Scale,
    Window,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
enum EventRec {
    FrameAppended {
        frame: u64,
        stream: StreamRec,
        pages: Vec<u32>,
        transient: bool,
    },
    FrameEvicted {
        frame: u64,
        pages: Vec<u32>,
    },
    RolledBack {
        frames: Vec<u64>,
    },
    SpecialPageOpened {
        page: u32,
    },
    PoolGrown {
        allocated_pages: usize,
        max_pages: usize,
    },
    SpecialPageDropped {
        page: u32,
        tokens: u32,
    },
    Reset,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct StatsRec {
    page_size: usize,
    scale_pages: usize,
    window_pages: usize,
    special_pages: usize,
    free_pages: usize,
    allocated_pages: usize,
    max_pages: usize,
    bytes_allocated: u64,
    bytes_resident: u64,
    tokens_visible: u64,
    frames_committed: u64,
    live_frames: usize,
    special_tokens: u64,
    special_tokens_dropped: u64,
    frames_evicted: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
enum PageRec {
    Free,
    Scale { frame: u64 },
    Window { frame: u64 },
    Transient { frame: u64 },
    Special { tokens: u32 },
}

/// The cache part of a frame as stored.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheRecord {
    stats: StatsRec,
    events: Vec<EventRec>,
    page_map: Vec<PageRec>,
}

impl From<&CacheSnapshot> for CacheRecord {
    fn from(c: &CacheSnapshot) -> Self {
        let s = &c.stats;
        Self {
            stats: StatsRec {
                page_size: s.page_size,
                scale_pages: s.scale_pages,
                window_pages: s.window_pages,
                special_pages: s.special_pages,
                free_pages: s.free_pages,
                allocated_pages: s.allocated_pages,
                max_pages: s.max_pages,
                bytes_allocated: s.bytes_allocated,
                bytes_resident: s.bytes_resident,
                tokens_visible: s.tokens_visible,
                frames_committed: s.frames_committed,
                live_frames: s.live_frames,
                special_tokens: s.special_tokens,
                special_tokens_dropped: s.special_tokens_dropped,
                frames_evicted: s.frames_evicted,
            },
            events: c.events.iter().map(event_to_rec).collect(),
            page_map: c.page_map.iter().map(|&p| page_to_rec(p)).collect(),
        }
    }
}

impl From<CacheRecord> for CacheSnapshot {
    fn from(c: CacheRecord) -> Self {
        let s = c.stats;
        Self {
            stats: CacheStats {
                page_size: s.page_size,
                scale_pages: s.scale_pages,
                window_pages: s.window_pages,
                special_pages: s.special_pages,
                free_pages: s.free_pages,
                allocated_pages: s.allocated_pages,
                max_pages: s.max_pages,
                bytes_allocated: s.bytes_allocated,
                bytes_resident: s.bytes_resident,
                tokens_visible: s.tokens_visible,
                frames_committed: s.frames_committed,
                live_frames: s.live_frames,
                special_tokens: s.special_tokens,
                special_tokens_dropped: s.special_tokens_dropped,
                frames_evicted: s.frames_evicted,
            },
            events: c.events.into_iter().map(event_from_rec).collect(),
            page_map: c.page_map.into_iter().map(page_from_rec).collect(),
        }
    }
}

fn stream_to_rec(s: PatchStream) -> StreamRec {
    match s {
        PatchStream::Scale => StreamRec::Scale,
        PatchStream::Window => StreamRec::Window,
    }
}

fn event_to_rec(e: &CacheEvent) -> EventRec {
    match e.clone() {
        CacheEvent::FrameAppended {
            frame,
            stream,
            pages,
            transient,
        } => EventRec::FrameAppended {
            frame,
            stream: stream_to_rec(stream),
            pages,
            transient,
        },
        CacheEvent::FrameEvicted { frame, pages } => EventRec::FrameEvicted { frame, pages },
        CacheEvent::RolledBack { frames } => EventRec::RolledBack { frames },
        CacheEvent::SpecialPageOpened { page } => EventRec::SpecialPageOpened { page },
        CacheEvent::PoolGrown {
            allocated_pages,
            max_pages,
        } => EventRec::PoolGrown {
            allocated_pages,
            max_pages,
        },
        CacheEvent::SpecialPageDropped { page, tokens } => {
            EventRec::SpecialPageDropped { page, tokens }
        }
        CacheEvent::Reset => EventRec::Reset,
    }
}

fn event_from_rec(e: EventRec) -> CacheEvent {
    match e {
        EventRec::FrameAppended {
            frame,
            stream,
            pages,
            transient,
        } => CacheEvent::FrameAppended {
            frame,
            stream: match stream {
                StreamRec::Scale => PatchStream::Scale,
                StreamRec::Window => PatchStream::Window,
            },
            pages,
            transient,
        },
        EventRec::FrameEvicted { frame, pages } => CacheEvent::FrameEvicted { frame, pages },
        EventRec::RolledBack { frames } => CacheEvent::RolledBack { frames },
        EventRec::SpecialPageOpened { page } => CacheEvent::SpecialPageOpened { page },
        EventRec::PoolGrown {
            allocated_pages,
            max_pages,
        } => CacheEvent::PoolGrown {
            allocated_pages,
            max_pages,
        },
        EventRec::SpecialPageDropped { page, tokens } => {
            CacheEvent::SpecialPageDropped { page, tokens }
        }
        EventRec::Reset => CacheEvent::Reset,
    }
}

fn page_to_rec(p: PageState) -> PageRec {
    match p {
        PageState::Free => PageRec::Free,
        PageState::Scale { frame } => PageRec::Scale { frame },
        PageState::Window { frame } => PageRec::Window { frame },
        PageState::Transient { frame } => PageRec::Transient { frame },
        PageState::Special { tokens } => PageRec::Special { tokens },
    }
}

fn page_from_rec(p: PageRec) -> PageState {
    match p {
        PageRec::Free => PageState::Free,
        PageRec::Scale { frame } => PageState::Scale { frame },
        PageRec::Window { frame } => PageState::Window { frame },
        PageRec::Transient { frame } => PageState::Transient { frame },
        PageRec::Special { tokens } => PageState::Special { tokens },
    }
}
