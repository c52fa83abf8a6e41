//! Host storage of K/V pages, laid out `[layer][page][K|V][page_size][heads][head_dim]`.

use half::bf16;

use super::{CacheConfig, CacheError, StorageDtype, TokenRun};

/// An element type K/V can be stored in. Attention reads it back as f32.
pub trait KvElem: Copy + Send + Sync + Default + 'static {
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;
}

impl KvElem for f32 {
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl KvElem for bf16 {
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

/// A buffer of K or V elements in the cache's storage dtype.
#[derive(Debug, Clone, PartialEq)]
pub enum KvBuf {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
}

impl KvBuf {
    pub fn zeros(dtype: StorageDtype, len: usize) -> Self {
        match dtype {
            StorageDtype::F32 => KvBuf::F32(vec![0.0; len]),
            StorageDtype::Bf16 => KvBuf::Bf16(vec![bf16::ZERO; len]),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            KvBuf::F32(v) => v.len(),
            KvBuf::Bf16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Grows or shrinks to `len`, reserving exactly what growth needs.
    pub fn resize_exact(&mut self, len: usize) {
        match self {
            KvBuf::F32(v) => {
                v.reserve_exact(len.saturating_sub(v.len()));
                v.resize(len, 0.0)
            }
            KvBuf::Bf16(v) => {
                v.reserve_exact(len.saturating_sub(v.len()));
                v.resize(len, bf16::ZERO)
            }
        }
    }

    pub fn resize(&mut self, len: usize) {
        match self {
            KvBuf::F32(v) => v.resize(len, 0.0),
            KvBuf::Bf16(v) => v.resize(len, bf16::ZERO),
        }
    }

    /// Stores `src` (f32) at `offset`, rounding to the storage dtype.
    pub fn write(&mut self, offset: usize, src: &[f32]) {
        match self {
            KvBuf::F32(v) => v[offset..offset + src.len()].copy_from_slice(src),
            KvBuf::Bf16(v) => {
                for (d, &s) in v[offset..offset + src.len()].iter_mut().zip(src) {
                    *d = bf16::from_f32(s);
                }
            }
        }
    }

    /// Appends `src` (f32), rounding to the storage dtype.
    pub fn extend_from_f32(&mut self, src: &[f32]) {
        match self {
            KvBuf::F32(v) => v.extend_from_slice(src),
            KvBuf::Bf16(v) => v.extend(src.iter().map(|&x| bf16::from_f32(x))),
        }
    }

    /// Appends `other[range]` (same dtype) without conversion.
    pub fn extend_from_buf(&mut self, other: &KvBuf, range: std::ops::Range<usize>) {
        match (self, other) {
            (KvBuf::F32(d), KvBuf::F32(s)) => d.extend_from_slice(&s[range]),
            (KvBuf::Bf16(d), KvBuf::Bf16(s)) => d.extend_from_slice(&s[range]),
            (KvBuf::F32(d), KvBuf::Bf16(s)) => d.extend(s[range].iter().map(|x| x.to_f32())),
            (KvBuf::Bf16(d), KvBuf::F32(s)) => {
                d.extend(s[range].iter().map(|&x| bf16::from_f32(x)))
            }
        }
    }

    /// Reads `dst.len()` elements from `offset` as f32.
    pub fn read(&self, offset: usize, dst: &mut [f32]) {
        match self {
            KvBuf::F32(v) => dst.copy_from_slice(&v[offset..offset + dst.len()]),
            KvBuf::Bf16(v) => {
                let n = dst.len();
                for (d, s) in dst.iter_mut().zip(&v[offset..offset + n]) {
                    *d = s.to_f32();
                }
            }
        }
    }
}

/// Host pages of every layer. Grows as page ids are first handed out, so a short or small
/// session does not pay for the whole pool.
#[derive(Debug, Clone)]
pub struct HostKvStore {
    layers: Vec<KvBuf>,
    page_elems: usize,
    token_elems: usize,
    pages: usize,
    grow_pages: usize,
    max_pages: usize,
}

impl HostKvStore {
    pub fn new(cfg: &CacheConfig) -> Self {
        Self {
            layers: (0..cfg.layers)
                .map(|_| KvBuf::zeros(cfg.dtype, 0))
                .collect(),
            page_elems: cfg.page_elems(),
            token_elems: cfg.heads * cfg.head_dim,
            pages: 0,
            grow_pages: cfg.growth_pages(),
            max_pages: cfg.max_pages(),
        }
    }

    /// Makes room for page ids below `pages`, growing by whole chunks (exactly, never doubling:
    /// at full size one page of every layer is 196 MB in f32).
    pub fn ensure_pages(&mut self, pages: usize) {
        if pages > self.pages {
            let target = pages
                .max(self.pages + self.grow_pages)
                .min(self.max_pages.max(pages));
            for layer in &mut self.layers {
                layer.resize_exact(target * 2 * self.page_elems);
            }
            self.pages = target;
        }
    }

    pub fn pages(&self) -> usize {
        self.pages
    }

    pub fn bytes_allocated(&self) -> u64 {
        let elem = match self.layers.first() {
            Some(KvBuf::Bf16(_)) => 2,
            _ => 4,
        };
        (self.layers.len() * self.pages * 2 * self.page_elems * elem) as u64
    }

    fn layer_index(&self, layer: usize) -> Result<usize, CacheError> {
        if layer < self.layers.len() {
            Ok(layer)
        } else {
            Err(CacheError::LayerOutOfRange {
                layer,
                layers: self.layers.len(),
            })
        }
    }

    /// Offset of token `slot` of `page`'s K (`kv = 0`) or V (`kv = 1`).
    #[inline]
    pub fn offset(&self, page: u32, kv: usize, slot: usize) -> usize {
        (page as usize * 2 + kv) * self.page_elems + slot * self.token_elems
    }

    /// Writes one layer's K and V of the step (`[S·P][heads][head_dim]`) into their pages.
    pub fn write_runs(
        &mut self,
        layer: usize,
        runs: &[TokenRun],
        k: &[f32],
        v: &[f32],
    ) -> Result<(), CacheError> {
        let layer = self.layer_index(layer)?;
        let te = self.token_elems;
        for run in runs {
            let src = run.src_token as usize * te..(run.src_token + run.len) as usize * te;
            if src.end > k.len() || src.end > v.len() {
                return Err(CacheError::WrongSize {
                    what: "K/V of the step",
                    expected: src.end,
                    found: k.len().min(v.len()),
                });
            }
            let k_at = self.offset(run.page, 0, run.slot as usize);
            let v_at = self.offset(run.page, 1, run.slot as usize);
            let buf = &mut self.layers[layer];
            buf.write(k_at, &k[src.clone()]);
            buf.write(v_at, &v[src]);
        }
        Ok(())
    }

    pub fn layer(&self, layer: usize) -> Result<&KvBuf, CacheError> {
        Ok(&self.layers[self.layer_index(layer)?])
    }

    pub fn token_elems(&self) -> usize {
        self.token_elems
    }
}
