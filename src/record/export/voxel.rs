//! Voxel-grid downsampling: one point per occupied cube of edge `size`, at the mean position
//! and colour of the points inside, with their highest confidence and earliest frame.

use std::collections::HashMap;

use super::Cloud;

#[derive(Default)]
struct Acc {
    sum: [f64; 3],
    rgb: [u32; 3],
    confidence: f32,
    frame: u32,
    n: u32,
}

/// `size` must be positive and finite (the CLI checks); otherwise the cloud is returned as is.
pub fn downsample(cloud: &Cloud, size: f32) -> Cloud {
    if !(size.is_finite() && size > 0.0) {
        return cloud.clone();
    }
    let mut slot: HashMap<[i64; 3], usize> = HashMap::new();
    let mut cells: Vec<Acc> = Vec::new();
    for k in 0..cloud.len() {
        let p = cloud.xyz[k];
        let key = p.map(|v| (f64::from(v) / f64::from(size)).floor() as i64);
        let i = *slot.entry(key).or_insert_with(|| {
            cells.push(Acc {
                frame: u32::MAX,
                confidence: f32::MIN,
                ..Acc::default()
            });
            cells.len() - 1
        });
        let c = &mut cells[i];
        for ((sum, rgb), (v, col)) in c
            .sum
            .iter_mut()
            .zip(&mut c.rgb)
            .zip(p.iter().zip(cloud.rgb[k]))
        {
            *sum += f64::from(*v);
            *rgb += u32::from(col);
        }
        c.confidence = c.confidence.max(cloud.confidence[k]);
        c.frame = c.frame.min(cloud.frame[k]);
        c.n += 1;
    }
    let mut out = Cloud::default();
    for c in cells {
        let n = f64::from(c.n);
        out.xyz.push(c.sum.map(|s| (s / n) as f32));
        out.rgb.push(
            c.rgb
                .map(|s| ((s as f64 / n).round() as u32).min(255) as u8),
        );
        out.confidence.push(c.confidence);
        out.frame.push(c.frame);
    }
    out
}
