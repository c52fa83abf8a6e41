//! Voxel-grid downsampling: one point per occupied cube of edge `size`, at the mean position
//! and colour of the points inside, with their highest confidence and earliest frame.

use std::collections::HashMap;

use super::Cloud;

#[derive(Default)]
struct Acc {
    sum: [f64; 3],
    normal: [f64; 3],
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
        if let Some(n) = cloud.normal.get(k) {
            for (acc, v) in c.normal.iter_mut().zip(n) {
                *acc += f64::from(*v);
            }
        }
        c.confidence = c.confidence.max(cloud.confidence[k]);
        c.frame = c.frame.min(cloud.frame[k]);
        c.n += 1;
    }
    let mut out = Cloud::default();
    let with_normals = !cloud.normal.is_empty();
    for c in cells {
        let n = f64::from(c.n);
        if with_normals {
            // The mean direction; normals that cancel exactly (a thin wall seen from both
            // sides) get −z, the model's direction back towards its first camera, never a
            // zero vector.
            let len = c.normal.iter().map(|v| v * v).sum::<f64>().sqrt();
            out.normal.push(if len > 0.0 {
                c.normal.map(|v| (v / len) as f32)
            } else {
                [0.0, 0.0, -1.0]
            });
        }
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
