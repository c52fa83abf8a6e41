//! A plain owned f32 tensor: a shape and row-major data. The model keeps activations and weights
//! in this form; it is deliberately minimal (no views, no strides) so every op is easy to audit.

use super::error::{ModelError, Result};

#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Tensor {
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Result<Self> {
        let expected = element_count(&shape);
        if expected != data.len() {
            return Err(ModelError::BadInput(format!(
                "tensor of shape {shape:?} needs {expected} values, got {}",
                data.len()
            )));
        }
        Ok(Tensor { shape, data })
    }

    pub fn zeros(shape: Vec<usize>) -> Self {
        let n = element_count(&shape);
        Tensor {
            shape,
            data: vec![0.0; n],
        }
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Same data, new shape (the element count must agree).
    pub fn reshaped(self, shape: Vec<usize>) -> Result<Self> {
        Tensor::new(shape, self.data)
    }
}

pub fn element_count(shape: &[usize]) -> usize {
    shape.iter().product()
}
