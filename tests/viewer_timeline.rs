//! The replay timeline under egui_kittest: play/pause and the speeds send their controls, the
//! slider follows the newest frame shown (clamped to the session), and a live stream's window
//! shows no timeline.

use eframe::egui;
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable as _;
use streamrecon::viewer::ViewerControl;
use streamrecon::viewer::panels::{TimelineState, replay_timeline_ui};

type State = (TimelineState, bool, Option<u64>, Vec<ViewerControl>);

fn harness(newest: Option<u64>) -> Harness<'static, State> {
    Harness::builder()
        .with_size(egui::vec2(420.0, 120.0))
        .with_accessibility_check(false)
        .build_ui_state(
            |ui, (timeline, paused, newest, sent): &mut State| {
                sent.extend(replay_timeline_ui(ui, timeline, paused, *newest));
            },
            (
                TimelineState {
                    first_frame: 10,
                    last_frame: 40,
                    frame: 10,
                    speed: 1.0,
                },
                false,
                newest,
                Vec::new(),
            ),
        )
}

#[test]
fn play_pause_and_speed_send_their_controls() {
    let mut h = harness(None);
    h.run();
    h.get_by_label("Pause").click();
    h.run();
    h.get_by_label("2×").click();
    h.run();
    h.get_by_label("max").click();
    h.run();
    // Already at that speed: nothing to send.
    h.get_by_label("max").click();
    h.run();
    h.get_by_label("Play").click();
    h.run();
    let (timeline, paused, _, sent) = h.state();
    assert!(!paused);
    assert_eq!(timeline.speed, 0.0);
    assert_eq!(
        sent,
        &vec![
            ViewerControl::Pause(true),
            ViewerControl::Speed(2.0),
            ViewerControl::Speed(0.0),
            ViewerControl::Pause(false),
        ]
    );
}

#[test]
fn the_slider_follows_the_newest_frame_within_the_session() {
    let mut h = harness(Some(25));
    h.run();
    assert_eq!(h.state().0.frame, 25);
    h.state_mut().2 = Some(99);
    h.run();
    assert_eq!(h.state().0.frame, 40, "clamped to the last frame");
    assert!(h.state().3.is_empty(), "following is not seeking");
}
