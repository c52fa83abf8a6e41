//! Where a model's tensors live. The network's pieces (`TransformerBlock`, `DinoBackbone`,
//! `Aggregator`, `CameraHead`, `DptHead`, `GctModel`) are one weight tree, generic over a
//! [`Storage`]: the CPU model instantiates it with [`Host`] (f32 vectors, the oracle), the GPU
//! engine with its device storage (bf16 matrices and filters, f32 parameters). Both are loaded
//! by the same code, each tensor going straight from the checkpoint to its place through a
//! [`Placement`].

use super::error::{ModelError, Result};
use super::weights::WeightStore;

/// The form each kind of parameter takes in one place.
pub trait Storage: 'static {
    /// Weights of matrix products, `[out][in]` (the GPU keeps them in bf16).
    type Matrix: Send + Sync;
    /// Parameters kept in f32 wherever the model runs: norms, LayerScale, tokens, and the few
    /// small matrices whose consumers read f32.
    type Full: Send + Sync;
    /// Convolution filters (the GPU keeps them in bf16, reordered for its NHWC products).
    type Filter: Send + Sync;
    /// Biases of products and convolutions.
    type Bias: Send + Sync;
}

/// The CPU's storage: every tensor an f32 vector in the checkpoint's own layout.
pub struct Host;

impl Storage for Host {
    type Matrix = Vec<f32>;
    type Full = Vec<f32>;
    type Filter = Vec<f32>;
    type Bias = Vec<f32>;
}

/// Which convolution a filter belongs to (a storage may reorder each differently).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterLayout {
    /// PyTorch `Conv2d`: `[out][in][kh][kw]`.
    Conv2d,
    /// PyTorch `ConvTranspose2d`: `[in][out][kh][kw]`.
    ConvTranspose,
}

/// Moves one tensor, read from a checkpoint as f32 with its checked shape, to where a storage
/// keeps it. An error is the placement's own (a device error, say): the loader names the
/// tensor and the file around it.
pub trait Placement<S: Storage> {
    fn matrix(&mut self, shape: &[usize], values: Vec<f32>) -> PlaceResult<S::Matrix>;
    fn full(&mut self, shape: &[usize], values: Vec<f32>) -> PlaceResult<S::Full>;
    fn filter(
        &mut self,
        shape: &[usize],
        values: Vec<f32>,
        layout: FilterLayout,
    ) -> PlaceResult<S::Filter>;
    fn bias(&mut self, shape: &[usize], values: Vec<f32>) -> PlaceResult<S::Bias>;
}

pub type PlaceError = Box<dyn std::error::Error + Send + Sync>;
pub type PlaceResult<T> = std::result::Result<T, PlaceError>;

/// Keeps tensors as they were read.
pub struct HostPlacement;

impl Placement<Host> for HostPlacement {
    fn matrix(&mut self, _: &[usize], values: Vec<f32>) -> PlaceResult<Vec<f32>> {
        Ok(values)
    }
    fn full(&mut self, _: &[usize], values: Vec<f32>) -> PlaceResult<Vec<f32>> {
        Ok(values)
    }
    fn filter(&mut self, _: &[usize], values: Vec<f32>, _: FilterLayout) -> PlaceResult<Vec<f32>> {
        Ok(values)
    }
    fn bias(&mut self, _: &[usize], values: Vec<f32>) -> PlaceResult<Vec<f32>> {
        Ok(values)
    }
}

/// A store and a placement together: what every piece's `load` takes.
pub struct Loader<'a, S: Storage> {
    store: &'a mut WeightStore,
    place: &'a mut dyn Placement<S>,
}

impl<'a, S: Storage> Loader<'a, S> {
    pub fn new(store: &'a mut WeightStore, place: &'a mut dyn Placement<S>) -> Self {
        Self { store, place }
    }

    pub fn store(&self) -> &WeightStore {
        self.store
    }

    fn placed<T>(&self, name: &str, placed: PlaceResult<T>) -> Result<T> {
        placed.map_err(|source| ModelError::Place {
            path: self.store.source().to_owned(),
            name: name.to_owned(),
            source,
        })
    }

    pub fn matrix(&mut self, name: &str, shape: &[usize]) -> Result<S::Matrix> {
        let values = self.store.take(name, shape)?;
        let placed = self.place.matrix(shape, values);
        self.placed(name, placed)
    }

    pub fn full(&mut self, name: &str, shape: &[usize]) -> Result<S::Full> {
        let values = self.store.take(name, shape)?;
        let placed = self.place.full(shape, values);
        self.placed(name, placed)
    }

    pub fn filter(
        &mut self,
        name: &str,
        shape: &[usize],
        layout: FilterLayout,
    ) -> Result<S::Filter> {
        let values = self.store.take(name, shape)?;
        let placed = self.place.filter(shape, values, layout);
        self.placed(name, placed)
    }

    pub fn bias(&mut self, name: &str, shape: &[usize]) -> Result<S::Bias> {
        let values = self.store.take(name, shape)?;
        let placed = self.place.bias(shape, values);
        self.placed(name, placed)
    }

    /// A tensor every storage keeps on the host (the DINO position table, which is resized on
    /// the CPU once per session size).
    pub fn host(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        self.store.take(name, shape)
    }

    /// A tensor the model never reads at inference, checked and marked as used unread.
    pub fn claim(&mut self, name: &str, shape: &[usize]) -> Result<()> {
        self.store.claim(name, shape)
    }
}
