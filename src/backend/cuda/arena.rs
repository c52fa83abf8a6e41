//! Device memory for the GPU model: typed raw pointers ([`DevPtr`]) and the one activation arena
//! they are carved from at session start.
//!
//! The frame step is captured into a CUDA graph, which freezes every kernel argument: buffers
//! must therefore sit at fixed addresses for the whole session and nothing may be allocated while
//! a frame runs. Kernels and cuBLASLt take plain device addresses, so the model passes
//! [`DevPtr`]s (address + element count) around instead of borrowed cudarc views; the owner (an
//! [`Arena`] or a [`cudarc::driver::CudaSlice`]) must outlive every pointer taken from it.

use std::marker::PhantomData;

use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};

use super::{CudaDevice, CudaError};

/// Alignment of every arena allocation: enough for 16-byte vector loads, TMA and cuBLASLt.
pub const ARENA_ALIGN: usize = 256;

/// A typed device address and the number of `T` elements behind it.
pub struct DevPtr<T> {
    addr: u64,
    len: usize,
    _elem: PhantomData<T>,
}

impl<T> Clone for DevPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DevPtr<T> {}

impl<T> std::fmt::Debug for DevPtr<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DevPtr({:#x}, {} x {})",
            self.addr,
            self.len,
            std::any::type_name::<T>()
        )
    }
}

impl<T> DevPtr<T> {
    /// # Safety
    /// `addr` must point to `len` valid elements of `T` on the device for as long as the pointer
    /// (or anything derived from it) is used.
    pub unsafe fn from_raw(addr: u64, len: usize) -> Self {
        Self {
            addr,
            len,
            _elem: PhantomData,
        }
    }

    /// The address of a cudarc allocation or view. It must outlive the pointer; event tracking
    /// must be off for the context (the model turns it off) or the caller must order work itself.
    pub fn of<S: DevicePtr<T>>(buf: &S) -> Self {
        let (addr, _sync) = buf.device_ptr(buf.stream());
        Self {
            addr,
            len: buf.len(),
            _elem: PhantomData,
        }
    }

    /// No buffer: address 0, no elements (an argument the kernel does not read; every length
    /// check against it fails).
    pub fn null() -> Self {
        Self {
            addr: 0,
            len: 0,
            _elem: PhantomData,
        }
    }

    /// The raw address, for kernel arguments (`let a = p.addr(); builder.arg(&a)`).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `len` elements starting `start` elements in.
    pub fn slice(&self, start: usize, len: usize) -> Result<Self, CudaError> {
        if start.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(CudaError::Invalid(format!(
                "device range [{start}, +{len}) outside a buffer of {} elements",
                self.len
            )));
        }
        Ok(Self {
            addr: self.addr + (start * std::mem::size_of::<T>()) as u64,
            len,
            _elem: PhantomData,
        })
    }

    /// Errors unless the buffer holds at least `len` elements (`what` names it in the message).
    pub fn check_len(&self, len: usize, what: &str) -> Result<(), CudaError> {
        if self.len < len {
            return Err(CudaError::Invalid(format!(
                "{what}: needs {len} elements, the buffer holds {}",
                self.len
            )));
        }
        Ok(())
    }
}

/// One device allocation carved into fixed buffers by a bump pointer. Sized once at session start
/// (`plan` the buffers with an [`ArenaPlan`] first), never grown.
pub struct Arena {
    buf: CudaSlice<u8>,
    used: usize,
}

/// Counts the bytes a set of buffers needs, so the arena is allocated exactly once.
#[derive(Debug, Default, Clone, Copy)]
pub struct ArenaPlan {
    bytes: usize,
}

fn aligned_bytes<T>(len: usize) -> usize {
    (len * std::mem::size_of::<T>()).div_ceil(ARENA_ALIGN) * ARENA_ALIGN
}

impl ArenaPlan {
    pub fn add<T>(&mut self, len: usize) {
        self.bytes += aligned_bytes::<T>(len);
    }
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Arena {
    /// Allocates `bytes` (zeroed) on the device.
    pub fn new(dev: &CudaDevice, bytes: usize) -> Result<Self, CudaError> {
        let buf = dev.stream.alloc_zeros::<u8>(bytes.max(ARENA_ALIGN))?;
        Ok(Self { buf, used: 0 })
    }

    /// The next `len` elements of `T`, 256-byte aligned.
    pub fn alloc<T: DeviceRepr>(&mut self, len: usize) -> Result<DevPtr<T>, CudaError> {
        let bytes = aligned_bytes::<T>(len);
        if self.used + bytes > self.buf.len() {
            return Err(CudaError::Invalid(format!(
                "activation arena exhausted: {} of {} bytes used, {bytes} more asked",
                self.used,
                self.buf.len()
            )));
        }
        let base = DevPtr::of(&self.buf);
        let addr = base.addr() + self.used as u64;
        self.used += bytes;
        // SAFETY: in bounds of `buf` (checked above), which the arena owns; callers keep the
        // arena alive while they use the pointer.
        Ok(unsafe { DevPtr::from_raw(addr, len) })
    }

    pub fn used_bytes(&self) -> usize {
        self.used
    }

    pub fn capacity_bytes(&self) -> usize {
        self.buf.len()
    }
}
