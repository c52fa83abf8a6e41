//! Which live frames become keyframes when nobody knows how many frames will come.
//!
//! The reference picks `keyframe_interval = ceil(N / 320)` from the total frame count `N`.
//! A camera has no `N`, so the policy here works from a **budget of committed frames**
//! instead: `min(view_budget, max_frame_num − 1)`, where 320 is the number of views the model
//! was trained on and `max_frame_num` (1024) is the length of the 3D RoPE table; the `− 1`
//! keeps room for one more non-keyframe, whose temporal index equals the committed count.
//!
//! - [`KeyframeRule::Fixed`]: every `interval`-th frame (the reference's rule).
//! - [`KeyframeRule::Adaptive`]: the interval doubles each time the remaining budget halves,
//!   so every stage of the stream spends about the same number of frames and the budget lasts
//!   about `log2(budget) · budget · base / 2` frames (1460 frames for 320 with base 1).
//!
//! When the budget is spent, [`OnBudget`] decides: `Freeze` keeps the map and tracks the
//! following frames as non-keyframes against it, `Reset` starts a new session. See
//! docs/pipeline.md.

/// How keyframes are spaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyframeRule {
    Fixed { interval: u64 },
    Adaptive { base_interval: u64 },
}

/// What happens once the committed frames reach the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OnBudget {
    /// Commit nothing more; later frames are non-keyframes against the frozen map.
    #[default]
    Freeze,
    /// Start a new session (new scale frames, empty cache); the old map is not aligned to it.
    Reset,
}

/// The spelling `--on-budget` takes.
impl std::fmt::Display for OnBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OnBudget::Freeze => "freeze",
            OnBudget::Reset => "reset",
        })
    }
}

/// Views the released model was trained on.
pub const TRAINED_VIEWS: u64 = 320;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyframePolicy {
    pub rule: KeyframeRule,
    /// Most committed frames (scale frames included) a session may hold.
    pub view_budget: u64,
    pub on_budget: OnBudget,
}

impl Default for KeyframePolicy {
    fn default() -> Self {
        KeyframePolicy {
            rule: KeyframeRule::Adaptive { base_interval: 1 },
            view_budget: TRAINED_VIEWS,
            on_budget: OnBudget::Freeze,
        }
    }
}

impl KeyframePolicy {
    /// The reference's choice for a sequence of known length: a fixed interval
    /// `ceil(total / budget)`.
    pub fn for_known_length(total: u64, view_budget: u64) -> Self {
        KeyframePolicy {
            rule: KeyframeRule::Fixed {
                interval: total.div_ceil(view_budget.max(1)).max(1),
            },
            view_budget,
            on_budget: OnBudget::Freeze,
        }
    }

    /// Committed frames a session may hold given the RoPE table length.
    pub fn budget(&self, max_frame_num: usize) -> u64 {
        self.view_budget
            .min((max_frame_num as u64).saturating_sub(1))
    }
}

/// Why a keyframe rule did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadKeyframeRule {
    #[error("`{0}` is not a positive interval")]
    Interval(String),
    #[error("`{0}` needs an interval: {0}:N")]
    NoInterval(String),
    #[error("unknown keyframe rule `{0}` (use fixed:N, adaptive or adaptive:BASE)")]
    Unknown(String),
}

impl std::str::FromStr for KeyframeRule {
    type Err = BadKeyframeRule;
    /// `fixed:N`, `adaptive` or `adaptive:BASE`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, arg) = match s.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (s, None),
        };
        let number = |a: Option<&str>, default: Option<u64>| -> Result<u64, BadKeyframeRule> {
            match a {
                Some(a) => a
                    .parse::<u64>()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| BadKeyframeRule::Interval(a.to_owned())),
                None => default.ok_or_else(|| BadKeyframeRule::NoInterval(name.to_owned())),
            }
        };
        match name {
            "fixed" => Ok(KeyframeRule::Fixed {
                interval: number(arg, None)?,
            }),
            "adaptive" => Ok(KeyframeRule::Adaptive {
                base_interval: number(arg, Some(1))?,
            }),
            _ => Err(BadKeyframeRule::Unknown(s.to_owned())),
        }
    }
}

/// What to do with the next streaming frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Keyframe,
    NonKeyframe,
    /// The budget is spent and the policy says reset: start a new session with this frame.
    Reset,
}

/// The policy applied to one session's stream of frames after its scale frames.
#[derive(Debug, Clone)]
pub struct KeyframeScheduler {
    policy: KeyframePolicy,
    budget: u64,
    scale_frames: u64,
    /// Non-keyframes since the last keyframe; `None` before the first streaming frame.
    since_keyframe: Option<u64>,
}

/// The policy cannot be applied to this model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "keyframe budget {budget} (view budget {view_budget}, RoPE table {max_frame_num}) must exceed the {scale_frames} scale frames"
)]
pub struct BudgetTooSmall {
    pub budget: u64,
    pub view_budget: u64,
    pub max_frame_num: usize,
    pub scale_frames: u64,
}

impl KeyframeScheduler {
    pub fn new(
        policy: KeyframePolicy,
        scale_frames: usize,
        max_frame_num: usize,
    ) -> Result<Self, BudgetTooSmall> {
        let budget = policy.budget(max_frame_num);
        let scale_frames = scale_frames as u64;
        if budget <= scale_frames {
            return Err(BudgetTooSmall {
                budget,
                view_budget: policy.view_budget,
                max_frame_num,
                scale_frames,
            });
        }
        Ok(KeyframeScheduler {
            policy,
            budget,
            scale_frames,
            since_keyframe: None,
        })
    }

    pub fn policy(&self) -> &KeyframePolicy {
        &self.policy
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// The interval in force when `committed` frames are in the cache.
    pub fn interval(&self, committed: u64) -> u64 {
        match self.policy.rule {
            KeyframeRule::Fixed { interval } => interval.max(1),
            KeyframeRule::Adaptive { base_interval } => {
                let stream_budget = self.budget - self.scale_frames;
                let remaining = self.budget.saturating_sub(committed).max(1);
                // k = floor(log2(stream_budget / remaining)): one doubling per halving.
                let mut k = 0u32;
                while k < 32 && remaining.saturating_mul(2u64 << k) <= stream_budget {
                    k += 1;
                }
                base_interval.max(1).saturating_mul(1u64 << k)
            }
        }
    }

    /// Decide for a frame that runs after `keyframes_ahead` keyframes decided but not run yet
    /// (a frame held for a two-frame step): they will have been committed by the time this
    /// frame runs, so counting them gives the decision the frame would get streamed alone.
    pub fn decide_after(&mut self, committed: u64, keyframes_ahead: u64) -> Decision {
        self.decide(committed + keyframes_ahead)
    }

    /// Decide for the next frame given the cache's committed count.
    pub fn decide(&mut self, committed: u64) -> Decision {
        if committed >= self.budget {
            return match self.policy.on_budget {
                OnBudget::Freeze => Decision::NonKeyframe,
                OnBudget::Reset => Decision::Reset,
            };
        }
        let keyframe = match self.since_keyframe {
            None => true,
            Some(gap) => gap + 1 >= self.interval(committed),
        };
        if keyframe {
            self.since_keyframe = Some(0);
            Decision::Keyframe
        } else {
            self.since_keyframe = self.since_keyframe.map(|g| g + 1);
            Decision::NonKeyframe
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::streaming_schedule;

    fn run(mut s: KeyframeScheduler, frames: u64, scale: u64) -> (Vec<Decision>, u64) {
        let mut committed = scale;
        let mut out = Vec::new();
        for _ in 0..frames {
            let d = s.decide(committed);
            if d == Decision::Keyframe {
                committed += 1;
            }
            out.push(d);
        }
        (out, committed)
    }

    #[test]
    fn fixed_rule_is_the_reference_schedule() {
        for interval in [1u64, 2, 3, 5] {
            let policy = KeyframePolicy {
                rule: KeyframeRule::Fixed { interval },
                ..KeyframePolicy::default()
            };
            let s = KeyframeScheduler::new(policy, 8, 1024).unwrap();
            let (decisions, _) = run(s, 100, 8);
            let reference: Vec<bool> = streaming_schedule(108, 8, interval as usize)
                .into_iter()
                .skip(1)
                .map(|c| c.keyframe)
                .collect();
            let ours: Vec<bool> = decisions.iter().map(|d| *d == Decision::Keyframe).collect();
            assert_eq!(ours, reference, "interval {interval}");
        }
    }

    #[test]
    fn adaptive_rule_stays_within_budget_and_spreads_it() {
        let s = KeyframeScheduler::new(KeyframePolicy::default(), 8, 1024).unwrap();
        assert_eq!(s.budget(), 320);
        assert_eq!(s.interval(8), 1);
        // Half the stream budget (312/2 = 156) used: interval doubles.
        assert_eq!(s.interval(8 + 155), 1);
        assert_eq!(s.interval(8 + 156), 2);
        assert_eq!(s.interval(8 + 234), 4);
        let (decisions, committed) = run(s, 5000, 8);
        assert_eq!(committed, 320, "the budget is used up, never exceeded");
        let last_key = decisions
            .iter()
            .rposition(|d| *d == Decision::Keyframe)
            .unwrap();
        // One doubling per halving: the budget lasts about log2(312)·312/2 ≈ 1290 frames;
        // exactly 1460 here (the figure docs/pipeline.md quotes).
        assert_eq!(last_key + 1, 1460);
        assert!(
            decisions[last_key + 1..]
                .iter()
                .all(|d| *d == Decision::NonKeyframe)
        );
    }

    #[test]
    fn rope_table_caps_the_budget_and_reset_is_reported() {
        let policy = KeyframePolicy {
            rule: KeyframeRule::Fixed { interval: 1 },
            view_budget: 320,
            on_budget: OnBudget::Reset,
        };
        let s = KeyframeScheduler::new(policy, 2, 64).unwrap();
        assert_eq!(s.budget(), 63);
        let (decisions, committed) = run(s, 70, 2);
        assert_eq!(committed, 63);
        assert_eq!(decisions[61], Decision::Reset);
    }

    /// Frames decided two at a time, the second ahead of the first's commit (as the inference
    /// thread holds one for a two-frame step), get the decisions they get one at a time.
    fn run_in_pairs(mut s: KeyframeScheduler, frames: u64, scale: u64) -> (Vec<Decision>, u64) {
        let mut committed = scale;
        let mut out = Vec::new();
        let mut held = Vec::new();
        for _ in 0..frames {
            let ahead = held.iter().filter(|d| **d == Decision::Keyframe).count() as u64;
            let d = s.decide_after(committed, ahead);
            held.push(d);
            // A pair runs, or a Reset splits it (the held frame runs alone).
            if held.len() == 2 || d == Decision::Reset {
                committed += held.iter().filter(|d| **d == Decision::Keyframe).count() as u64;
                out.append(&mut held);
            }
        }
        // An odd last frame runs alone.
        committed += held.iter().filter(|d| **d == Decision::Keyframe).count() as u64;
        out.append(&mut held);
        (out, committed)
    }

    #[test]
    fn pairs_are_decided_as_single_frames() {
        let policies = [
            (KeyframeRule::Fixed { interval: 1 }, OnBudget::Freeze, 40),
            (KeyframeRule::Fixed { interval: 2 }, OnBudget::Freeze, 40),
            (KeyframeRule::Fixed { interval: 3 }, OnBudget::Reset, 30),
            (
                KeyframeRule::Adaptive { base_interval: 1 },
                OnBudget::Freeze,
                40,
            ),
            (
                KeyframeRule::Adaptive { base_interval: 1 },
                OnBudget::Reset,
                320,
            ),
        ];
        for (rule, on_budget, view_budget) in policies {
            let policy = KeyframePolicy {
                rule,
                view_budget,
                on_budget,
            };
            let new = || KeyframeScheduler::new(policy, 2, 1024).unwrap();
            for frames in [1, 2, 7, 120, 2001] {
                let single = run(new(), frames, 2);
                let paired = run_in_pairs(new(), frames, 2);
                assert_eq!(paired, single, "{policy:?}, {frames} frames");
            }
            // The mixed pairs a two-frame step must handle all occur.
            if rule == (KeyframeRule::Fixed { interval: 3 }) {
                let (d, _) = run(new(), 12, 2);
                let pairs: Vec<_> = d.chunks(2).map(|p| (p[0], p[1])).collect();
                assert!(pairs.contains(&(Decision::Keyframe, Decision::NonKeyframe)));
                assert!(pairs.contains(&(Decision::NonKeyframe, Decision::Keyframe)));
                assert!(pairs.contains(&(Decision::NonKeyframe, Decision::NonKeyframe)));
            }
        }
    }

    #[test]
    fn budget_below_scale_frames_is_an_error() {
        let policy = KeyframePolicy {
            view_budget: 4,
            ..KeyframePolicy::default()
        };
        assert!(KeyframeScheduler::new(policy, 8, 1024).is_err());
    }

    #[test]
    fn parses_rules() {
        assert_eq!(
            "fixed:3".parse::<KeyframeRule>(),
            Ok(KeyframeRule::Fixed { interval: 3 })
        );
        assert_eq!(
            "adaptive".parse::<KeyframeRule>(),
            Ok(KeyframeRule::Adaptive { base_interval: 1 })
        );
        assert!("fixed".parse::<KeyframeRule>().is_err());
        assert!("fixed:0".parse::<KeyframeRule>().is_err());
    }
}
