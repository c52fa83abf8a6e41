//! The viewer's eye: an orbit camera (yaw, pitch, distance around a target) that also flies,
//! follows the reconstruction's camera, and snaps to reset and top views.
//!
//! The reconstruction's world is the first camera's frame in OpenCV convention (x right, y down,
//! z forward), so "up" in the viewer is -y.

use glam::{Mat4, Vec2, Vec3};

/// World up for the viewer: the OpenCV camera's y points down.
pub const WORLD_UP: Vec3 = Vec3::NEG_Y;

const MIN_DISTANCE: f32 = 0.01;
const MAX_DISTANCE: f32 = 10_000.0;
/// Pitch stays short of the poles so `look_at` never degenerates.
const MAX_PITCH: f32 = 89.0 * std::f32::consts::PI / 180.0;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OrbitCamera {
    pub target: Vec3,
    /// Radians around world up; 0 looks along +z (as the first camera does).
    pub yaw: f32,
    /// Radians above the horizon (positive: the eye is above the target, looking down).
    pub pitch: f32,
    pub distance: f32,
    pub fov_y: f32,
    pub near: f32,
    pub far: f32,
}

impl Default for OrbitCamera {
    fn default() -> Self {
        Self::reset_view(Vec3::new(0.0, 0.0, 1.0), 1.0)
    }
}

impl OrbitCamera {
    /// Behind and a little above the first camera, looking at `centre`, far enough to see a
    /// scene of `radius`.
    pub fn reset_view(centre: Vec3, radius: f32) -> Self {
        let fov_y = 60f32.to_radians();
        Self {
            target: centre,
            yaw: 0.0,
            pitch: 20f32.to_radians(),
            distance: (radius.max(0.05) / (fov_y * 0.5).sin()).clamp(MIN_DISTANCE, MAX_DISTANCE),
            fov_y,
            near: 0.01,
            far: 1000.0,
        }
    }

    /// Straight down onto `centre` from above.
    pub fn top_view(centre: Vec3, radius: f32) -> Self {
        Self {
            pitch: MAX_PITCH,
            ..Self::reset_view(centre, radius)
        }
    }

    /// Unit vector from the target to the eye.
    pub fn eye_direction(&self) -> Vec3 {
        let (sy, cy) = self.yaw.sin_cos();
        let (sp, cp) = self.pitch.sin_cos();
        // Horizontal plane is x/z; up is -y.
        Vec3::new(-cp * sy, -sp, -cp * cy)
    }

    pub fn eye(&self) -> Vec3 {
        self.target + self.eye_direction() * self.distance
    }

    /// Unit vector the eye looks along.
    pub fn forward(&self) -> Vec3 {
        -self.eye_direction()
    }

    /// Unit vector to the right of the view, in the horizontal plane.
    pub fn right(&self) -> Vec3 {
        self.forward().cross(WORLD_UP).normalize_or_zero()
    }

    /// Unit vector up on the screen.
    pub fn screen_up(&self) -> Vec3 {
        self.right().cross(self.forward()).normalize_or_zero()
    }

    /// Looks along `forward` from `eye`, keeping the current distance to the target.
    pub fn look_from(&mut self, eye: Vec3, forward: Vec3) {
        let forward = forward.normalize_or(Vec3::Z);
        let dir = -forward;
        self.pitch = (-dir.y)
            .clamp(-1.0, 1.0)
            .asin()
            .clamp(-MAX_PITCH, MAX_PITCH);
        self.yaw = (-dir.x).atan2(-dir.z);
        self.target = eye - self.eye_direction() * self.distance;
    }

    /// Orbits around the target by a drag of `delta_px` pixels.
    pub fn orbit(&mut self, delta_px: Vec2) {
        const RADIANS_PER_PIXEL: f32 = 0.008;
        self.yaw -= delta_px.x * RADIANS_PER_PIXEL;
        self.pitch = (self.pitch + delta_px.y * RADIANS_PER_PIXEL).clamp(-MAX_PITCH, MAX_PITCH);
    }

    /// Turns the view around the eye (fly-mode look), leaving the eye where it is.
    pub fn look_around(&mut self, delta_px: Vec2) {
        let eye = self.eye();
        self.orbit(-delta_px);
        self.target = eye - self.eye_direction() * self.distance;
    }

    /// Drags the scene by `delta_px` in a view `viewport_height_px` pixels tall: the point under
    /// the cursor at the target's depth stays under the cursor.
    pub fn pan(&mut self, delta_px: Vec2, viewport_height_px: f32) {
        let world_per_px =
            2.0 * self.distance * (self.fov_y * 0.5).tan() / viewport_height_px.max(1.0);
        self.target += (-self.right() * delta_px.x + self.screen_up() * delta_px.y) * world_per_px;
    }

    /// Zooms by scroll `steps` (positive: closer), multiplicatively so it feels the same at
    /// every scale.
    pub fn zoom(&mut self, steps: f32) {
        self.distance = (self.distance * (-steps * 0.1).exp()).clamp(MIN_DISTANCE, MAX_DISTANCE);
    }

    /// Moves eye and target together: `local.x` right, `local.y` up, `local.z` forward.
    pub fn fly(&mut self, local: Vec3) {
        self.target +=
            self.right() * local.x + self.screen_up() * local.y + self.forward() * local.z;
    }

    /// Follows a reconstruction camera: sits `back` behind it, looking where it looks, so its
    /// frustum and what it sees stay in view.
    pub fn follow(&mut self, world_from_camera: Mat4, back: f32) {
        let position = world_from_camera.w_axis.truncate();
        // OpenCV cameras look along their +z.
        let forward = world_from_camera.z_axis.truncate().normalize_or(Vec3::Z);
        self.distance = back.max(MIN_DISTANCE);
        self.look_from(position - forward * back, forward);
    }

    pub fn view_from_world(&self) -> Mat4 {
        Mat4::look_at_rh(self.eye(), self.target, WORLD_UP)
    }

    /// wgpu clip space (depth 0..1).
    pub fn clip_from_view(&self, aspect: f32) -> Mat4 {
        Mat4::perspective_rh(self.fov_y, aspect.max(1e-3), self.near, self.far)
    }

    pub fn clip_from_world(&self, aspect: f32) -> Mat4 {
        self.clip_from_view(aspect) * self.view_from_world()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: Vec3, b: Vec3) -> bool {
        (a - b).length() < 1e-4
    }

    #[test]
    fn default_looks_along_plus_z_from_behind_and_above() {
        let cam = OrbitCamera::reset_view(Vec3::new(0.0, 0.0, 2.0), 1.0);
        assert!(cam.eye().z < 2.0);
        assert!(cam.eye().y < 0.0, "above means -y");
        assert!(cam.forward().z > 0.5);
    }

    #[test]
    fn orbit_keeps_distance_and_target() {
        let mut cam = OrbitCamera::default();
        let target = cam.target;
        cam.orbit(Vec2::new(120.0, -45.0));
        assert!(close(cam.target, target));
        assert!(((cam.eye() - target).length() - cam.distance).abs() < 1e-4);
    }

    #[test]
    fn target_projects_to_the_centre() {
        let mut cam = OrbitCamera::default();
        cam.orbit(Vec2::new(33.0, 17.0));
        let clip = cam.clip_from_world(1.5) * cam.target.extend(1.0);
        let ndc = clip.truncate() / clip.w;
        assert!(ndc.x.abs() < 1e-4 && ndc.y.abs() < 1e-4);
        assert!((0.0..1.0).contains(&ndc.z));
    }

    #[test]
    fn zoom_is_multiplicative_and_clamped() {
        let mut cam = OrbitCamera::default();
        let d = cam.distance;
        cam.zoom(1.0);
        cam.zoom(-1.0);
        assert!((cam.distance - d).abs() < 1e-4);
        cam.zoom(1e6);
        assert_eq!(cam.distance, MIN_DISTANCE);
        cam.zoom(-1e6);
        assert_eq!(cam.distance, MAX_DISTANCE);
    }

    #[test]
    fn pan_moves_target_across_the_view_only() {
        let mut cam = OrbitCamera::default();
        let before = cam.target;
        cam.pan(Vec2::new(40.0, 10.0), 600.0);
        let moved = cam.target - before;
        assert!(moved.length() > 0.0);
        assert!(moved.dot(cam.forward()).abs() < 1e-5);
    }

    #[test]
    fn pitch_is_clamped_short_of_the_pole() {
        let mut cam = OrbitCamera::default();
        cam.orbit(Vec2::new(0.0, 1e5));
        assert!(cam.pitch <= MAX_PITCH);
        assert!(cam.view_from_world().is_finite());
    }

    #[test]
    fn top_view_looks_down() {
        let cam = OrbitCamera::top_view(Vec3::ZERO, 2.0);
        // Down is +y.
        assert!(cam.forward().y > 0.99);
        assert!(cam.view_from_world().is_finite());
    }

    #[test]
    fn look_from_round_trips() {
        let mut cam = OrbitCamera::default();
        let eye = Vec3::new(1.0, -0.5, 0.25);
        let forward = Vec3::new(0.3, 0.2, 1.0).normalize();
        cam.look_from(eye, forward);
        assert!(close(cam.eye(), eye));
        assert!(close(cam.forward(), forward));
    }

    #[test]
    fn look_around_keeps_the_eye() {
        let mut cam = OrbitCamera::default();
        let eye = cam.eye();
        cam.look_around(Vec2::new(50.0, 20.0));
        assert!(close(cam.eye(), eye));
    }

    #[test]
    fn fly_moves_eye_and_target_together() {
        let mut cam = OrbitCamera::default();
        let (eye, target) = (cam.eye(), cam.target);
        cam.fly(Vec3::new(0.0, 0.0, 0.5));
        assert!(close(cam.eye() - eye, cam.target - target));
        assert!(((cam.target - target).length() - 0.5).abs() < 1e-4);
    }

    #[test]
    fn follow_sits_behind_the_camera() {
        let mut cam = OrbitCamera::default();
        let world_from_camera = Mat4::from_translation(Vec3::new(1.0, 0.0, 3.0));
        cam.follow(world_from_camera, 0.5);
        assert!(close(cam.eye(), Vec3::new(1.0, 0.0, 2.5)));
        assert!(close(cam.forward(), Vec3::Z));
    }
}
