//! Optional capture of intermediate tensors (for parity checks against the reference's
//! fixtures). The model only pays for it when a recorder is passed.

use super::tensor::Tensor;

#[derive(Default, Debug)]
pub struct Recorder {
    pub tensors: Vec<(String, Tensor)>,
}

impl Recorder {
    /// Store a copy under `name`; the shape is the reference's for that tensor.
    pub fn put(&mut self, name: impl Into<String>, shape: Vec<usize>, data: &[f32]) {
        let tensor = Tensor {
            shape,
            data: data.to_vec(),
        };
        debug_assert_eq!(tensor.shape.iter().product::<usize>(), tensor.data.len());
        self.tensors.push((name.into(), tensor));
    }
}

/// Record only when a recorder is present.
pub fn put(rec: &mut Option<&mut Recorder>, name: &str, shape: Vec<usize>, data: &[f32]) {
    if let Some(r) = rec.as_deref_mut() {
        r.put(name, shape, data);
    }
}
