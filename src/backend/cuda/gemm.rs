//! Linear layers on cuBLASLt: `y[m][n] = x[m][k] · w[n][k]ᵀ (+ bias) (GELU)`, row-major, bf16 inputs,
//! f32 accumulation, with the bias and activation fused into the GEMM's epilogue.
//!
//! cuBLASLt is column-major; a row-major `[m][n]` result is the column-major `n × m` matrix, so the
//! call computes `yᵀ = w · xᵀ` with `w` (row-major `[n][k]`, i.e. column-major `k × n`) transposed.
//! Descriptors and the chosen algorithm are cached per shape: the heuristic query costs tens of
//! microseconds of host time, far too much for every one of the ~300 GEMMs of a frame, and a CUDA
//! graph capture needs none of it repeated.

use std::collections::HashMap;
use std::ffi::c_void;
use std::mem;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::CudaSlice;
use half::bf16;

use super::arena::DevPtr;
use super::{CudaDevice, CudaError};

/// What the GEMM's epilogue does after the product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Epilogue {
    None,
    Bias,
    /// Bias, then cuBLASLt's GELU (the tanh approximation).
    BiasGelu,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum OutType {
    Bf16,
    F32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PlanKey {
    m: usize,
    n: usize,
    k: usize,
    epilogue: Epilogue,
    out: OutType,
}

/// Descriptors and the algorithm for one shape.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    c: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: created by this plan and destroyed once; errors at teardown have no remedy.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.c);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

/// Workspace cuBLASLt may use (32 MiB is NVIDIA's recommendation for Hopper).
const WORKSPACE_BYTES: usize = 32 << 20;

fn lt_err(what: &str, e: cudarc::cublaslt::result::CublasError) -> CudaError {
    CudaError::Invalid(format!("cuBLASLt {what}: {e:?}"))
}

/// Errors unless `x` holds `[m][k]`, `w` `[n][k]`, `bias` `[n]` and `y` `[m][n]` elements.
fn check_shapes<A, B>(
    x: DevPtr<bf16>,
    w: DevPtr<bf16>,
    bias: Option<DevPtr<B>>,
    y: DevPtr<A>,
    m: usize,
    n: usize,
    k: usize,
) -> Result<(), CudaError> {
    if let Some(b) = bias {
        b.check_len(n, "linear bias")?;
    }
    x.check_len(m * k, "linear input")?;
    w.check_len(n * k, "linear weight")?;
    y.check_len(m * n, "linear output")
}

/// One cuBLASLt handle bound to the device's stream, its workspace and the plan cache.
pub struct Gemm {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    plans: HashMap<PlanKey, Plan>,
}

// SAFETY: the handle is only used through &mut self, on the one stream of its device.
unsafe impl Send for Gemm {}

impl Drop for Gemm {
    fn drop(&mut self) {
        self.plans.clear();
        // SAFETY: created in `new`, destroyed once.
        unsafe {
            let _ = lt::destroy_handle(self.handle);
        }
    }
}

/// Whether libcublasLt can be loaded (cudarc panics on first use otherwise).
pub fn cublaslt_present() -> bool {
    // SAFETY: only dlopens the library.
    unsafe { sys::is_culib_present() }
}

impl Gemm {
    pub fn new(dev: &CudaDevice) -> Result<Self, CudaError> {
        if !cublaslt_present() {
            return Err(CudaError::Unavailable(
                "libcublasLt (CUDA 13) was not found: the GPU model needs cuBLASLt".into(),
            ));
        }
        dev.ctx.bind_to_thread()?;
        let handle = lt::create_handle().map_err(|e| lt_err("create handle", e))?;
        let workspace = dev.stream.alloc_zeros::<u8>(WORKSPACE_BYTES)?;
        Ok(Self {
            handle,
            workspace,
            plans: HashMap::new(),
        })
    }

    /// `y = x · wᵀ (+ bias) (GELU)`; x `[m][k]`, w `[n][k]` (PyTorch's Linear layout), bias `[n]`,
    /// y `[m][n]`, all bf16.
    #[allow(clippy::too_many_arguments)]
    pub fn linear(
        &mut self,
        dev: &CudaDevice,
        x: DevPtr<bf16>,
        w: DevPtr<bf16>,
        bias: Option<DevPtr<bf16>>,
        y: DevPtr<bf16>,
        m: usize,
        n: usize,
        k: usize,
        epilogue: Epilogue,
    ) -> Result<(), CudaError> {
        if epilogue != Epilogue::None && bias.is_none() {
            return Err(CudaError::Invalid(format!(
                "linear {m}x{n}x{k}: epilogue {epilogue:?} needs a bias"
            )));
        }
        check_shapes(x, w, bias, y, m, n, k)?;
        let key = PlanKey {
            m,
            n,
            k,
            epilogue: if bias.is_some() && epilogue == Epilogue::None {
                Epilogue::Bias
            } else {
                epilogue
            },
            out: OutType::Bf16,
        };
        self.run(
            dev,
            key,
            x.addr(),
            w.addr(),
            bias.map(|b| b.addr()),
            y.addr(),
        )
    }

    /// `y = x · wᵀ (+ bias)` with an f32 result (and an f32 bias); x and w bf16.
    #[allow(clippy::too_many_arguments)]
    pub fn linear_f32out(
        &mut self,
        dev: &CudaDevice,
        x: DevPtr<bf16>,
        w: DevPtr<bf16>,
        bias: Option<DevPtr<f32>>,
        y: DevPtr<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), CudaError> {
        check_shapes(x, w, bias, y, m, n, k)?;
        let key = PlanKey {
            m,
            n,
            k,
            epilogue: if bias.is_some() {
                Epilogue::Bias
            } else {
                Epilogue::None
            },
            out: OutType::F32,
        };
        self.run(
            dev,
            key,
            x.addr(),
            w.addr(),
            bias.map(|b| b.addr()),
            y.addr(),
        )
    }

    fn run(
        &mut self,
        dev: &CudaDevice,
        key: PlanKey,
        x: u64,
        w: u64,
        bias: Option<u64>,
        y: u64,
    ) -> Result<(), CudaError> {
        if key.m == 0 || key.n == 0 {
            return Ok(());
        }
        if !self.plans.contains_key(&key) {
            let plan = self.make_plan(key)?;
            self.plans.insert(key, plan);
        }
        let plan = &self.plans[&key];
        let alpha = 1.0f32;
        let beta = 0.0f32;
        // SAFETY: the descriptors belong to this plan; pointers were length-checked by the callers;
        // all work is ordered on the device's one stream.
        unsafe {
            if let Some(bias) = bias {
                lt::set_matmul_desc_attribute(
                    plan.desc,
                    sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    (&bias) as *const u64 as *const c_void,
                    mem::size_of::<u64>(),
                )
                .map_err(|e| lt_err("bias pointer", e))?;
            }
            let ws = DevPtr::of(&self.workspace).addr();
            lt::matmul(
                self.handle,
                plan.desc,
                (&alpha) as *const f32 as *const c_void,
                (&beta) as *const f32 as *const c_void,
                w as *const c_void,
                plan.a,
                x as *const c_void,
                plan.b,
                y as *const c_void,
                plan.c,
                y as *mut c_void,
                plan.c,
                (&plan.algo) as *const _,
                ws as *mut c_void,
                WORKSPACE_BYTES,
                dev.stream.cu_stream() as *mut _,
            )
            .map_err(|e| lt_err(&format!("matmul {}x{}x{}", key.m, key.n, key.k), e))
        }
    }

    fn make_plan(&self, key: PlanKey) -> Result<Plan, CudaError> {
        let PlanKey {
            m,
            n,
            k,
            epilogue,
            out,
        } = key;
        let bf = sys::cudaDataType_t::CUDA_R_16BF;
        let out_type = match out {
            OutType::Bf16 => bf,
            OutType::F32 => sys::cudaDataType_t::CUDA_R_32F,
        };
        let desc = lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType_t::CUDA_R_32F,
        )
        .map_err(|e| lt_err("matmul descriptor", e))?;
        // A = w (column-major k x n, used transposed), B = x (column-major k x m), C = y (n x m).
        let a = lt::create_matrix_layout(bf, k as u64, n as u64, k as i64)
            .map_err(|e| lt_err("layout", e))?;
        let b = lt::create_matrix_layout(bf, k as u64, m as u64, k as i64)
            .map_err(|e| lt_err("layout", e))?;
        let c = lt::create_matrix_layout(out_type, n as u64, m as u64, n as i64)
            .map_err(|e| lt_err("layout", e))?;
        let mut plan = Plan {
            desc,
            a,
            b,
            c,
            // SAFETY: plain old data, filled by the heuristic below before any use.
            algo: unsafe { mem::zeroed() },
        };
        let set = |attr, value: &i32| {
            // SAFETY: a 4-byte attribute of this descriptor.
            unsafe {
                lt::set_matmul_desc_attribute(
                    desc,
                    attr,
                    value as *const i32 as *const c_void,
                    mem::size_of::<i32>(),
                )
            }
            .map_err(|e| lt_err("descriptor attribute", e))
        };
        set(
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
            &1, // CUBLAS_OP_T,
        )?;
        set(
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
            &0, // CUBLAS_OP_N,
        )?;
        let epi = match epilogue {
            Epilogue::None => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
            Epilogue::Bias => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            Epilogue::BiasGelu => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS,
        };
        set(
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE,
            &(epi as i32),
        )?;
        if epilogue != Epilogue::None {
            set(
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                &(out_type as i32),
            )?;
        }
        let pref = lt::create_matmul_pref().map_err(|e| lt_err("preference", e))?;
        let ws = WORKSPACE_BYTES;
        // SAFETY: descriptors created above; the preference is destroyed right after.
        let heuristic = unsafe {
            let r = lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws) as *const usize as *const c_void,
                mem::size_of::<usize>(),
            )
            .and_then(|_| lt::get_matmul_algo_heuristic(self.handle, desc, a, b, c, c, pref));
            let _ = lt::destroy_matmul_pref(pref);
            r
        }
        .map_err(|e| {
            lt_err(
                &format!("no algorithm for {m}x{n}x{k} ({epilogue:?}, {out:?} output)"),
                e,
            )
        })?;
        plan.algo = heuristic.algo;
        Ok(plan)
    }
}
