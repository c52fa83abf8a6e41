//! Messages into the pipeline (control) and out of it (events), and how events reach each
//! consumer.

use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender, bounded, unbounded};

use crate::attention::AttentionLayout;

use super::keyframe::KeyframePolicy;
use super::summary::PipelineSummary;
use crate::frame::FrameResult;

/// Requests to the inference thread. Settings marked "at reset" are kept pending and take
/// effect with the next [`Control::Reset`] (a session's cache cannot change shape midway).
#[derive(Debug, Clone, PartialEq)]
pub enum Control {
    /// Stop taking frames (a live source keeps only its newest frame meanwhile).
    Pause,
    Resume,
    /// Start a new session: empty cache, new scale frames, pending settings applied.
    Reset,
    /// Paged or dense attention, at reset.
    SetAttention(AttentionLayout),
    /// Keyframe rule, budget and budget action, at reset.
    SetKeyframePolicy(KeyframePolicy),
    /// Sliding window of keyframes kept in full, at reset.
    SetWindow(usize),
    /// Finish the frame in progress, discard queued frames, stop every thread.
    Stop,
}

/// What the pipeline reports, in order.
#[derive(Debug, Clone)]
pub enum PipelineEvent {
    Frame(Arc<FrameResult>),
    /// Something skipped or degraded; the run goes on.
    Warning(String),
    /// A stage failed. For the capture stage (a camera unplugged) the session and its map are
    /// kept and the inference thread waits for control; nothing already produced is lost.
    Error {
        stage: &'static str,
        message: String,
    },
    /// A new session started (by request or by the keyframe budget).
    SessionReset {
        reason: String,
    },
    /// The source has no more frames; every captured frame has been processed.
    InputEnded,
    /// Paused or resumed.
    Paused(bool),
    /// The last event: the inference thread is done.
    Stopped(Box<PipelineSummary>),
}

/// How a consumer takes events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Every event; inference waits when the consumer falls behind (the recorder).
    Lossless,
    /// Frame results are dropped while `capacity` of them wait in the consumer's queue (the
    /// viewer); other events are always delivered and never make inference wait.
    Latest,
}

pub(crate) struct Subscriber {
    sender: Sender<PipelineEvent>,
    delivery: Delivery,
    capacity: usize,
}

/// The consumers of a pipeline, set up before it starts.
#[derive(Default)]
pub struct Outputs {
    pub(crate) subscribers: Vec<Subscriber>,
}

impl Outputs {
    /// A new consumer with a queue of `capacity` events.
    pub fn subscribe(&mut self, delivery: Delivery, capacity: usize) -> Receiver<PipelineEvent> {
        let capacity = capacity.max(1);
        // A `Latest` queue is unbounded so that rare non-frame events never block; frames
        // are held to `capacity` by `publish`.
        let (sender, receiver) = match delivery {
            Delivery::Lossless => bounded(capacity),
            Delivery::Latest => unbounded(),
        };
        self.subscribers.push(Subscriber {
            sender,
            delivery,
            capacity,
        });
        receiver
    }

    /// Deliver one event to every consumer; consumers that hung up are forgotten.
    pub(crate) fn publish(&mut self, event: PipelineEvent) {
        let is_frame = matches!(event, PipelineEvent::Frame(_));
        self.subscribers.retain(|s| match (s.delivery, is_frame) {
            // Counting every queued event (not only frames) errs on the side of dropping. A
            // consumer that hung up is noticed at the next event that is sent.
            (Delivery::Latest, true) if s.sender.len() >= s.capacity => true,
            _ => s.sender.send(event.clone()).is_ok(),
        });
    }
}
