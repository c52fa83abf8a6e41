//! The CPU kernels the model is written over. All data is row-major f32; token activations are
//! `[tokens][channels]`, feature maps are `[channels][height][width]`.

pub mod activation;
pub mod attention;
pub mod conv;
pub mod linear;
pub mod norm;
pub mod resize;
pub mod rope;
