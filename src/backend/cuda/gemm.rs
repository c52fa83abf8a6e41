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
use std::sync::{Arc, Mutex};

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
    /// The heuristic's candidates, best guess first (`algo` is one of them).
    candidates: Vec<sys::cublasLtMatmulAlgo_t>,
}

/// How the algorithm of a new shape is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tuning {
    /// cuBLASLt's first guess.
    Heuristic,
    /// Time the heuristic's candidates on the call's own buffers once, keep the fastest. At
    /// M = 1005 the first guess is often a tile shape that leaves SMs idle.
    Measure,
}

/// Candidates asked of the heuristic when measuring.
const TUNING_CANDIDATES: usize = 16;
/// Timed launches per candidate (after one untimed).
const TUNING_REPS: usize = 5;

/// What measuring chose for one shape.
#[derive(Debug, Clone)]
pub struct TuneRecord {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub epilogue: Epilogue,
    pub candidates: usize,
    /// Time of the heuristic's first guess and of the chosen one, ms per launch.
    pub first_ms: f64,
    pub chosen_ms: f64,
    /// Position of the chosen algorithm in the heuristic's list.
    pub chosen: usize,
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

/// Algorithms chosen by measuring, shared by the GEMM handles of one model (its sessions and
/// their side streams): a shape is timed once per process, and two sessions of the same model
/// run the very same kernels.
#[derive(Clone, Default)]
pub struct SharedChoices(Arc<Mutex<HashMap<PlanKey, sys::cublasLtMatmulAlgo_t>>>);

// SAFETY: a cuBLASLt algorithm is plain data (an opaque array of integers) with no pointers.
unsafe impl Send for SharedChoices {}
unsafe impl Sync for SharedChoices {}

impl SharedChoices {
    fn get(&self, key: &PlanKey) -> Option<sys::cublasLtMatmulAlgo_t> {
        self.0.lock().ok().and_then(|m| m.get(key).copied())
    }

    fn put(&self, key: PlanKey, algo: sys::cublasLtMatmulAlgo_t) {
        if let Ok(mut m) = self.0.lock() {
            m.insert(key, algo);
        }
    }
}

/// The device addresses of one product.
#[derive(Debug, Clone, Copy)]
struct GemmArgs {
    x: u64,
    w: u64,
    bias: Option<u64>,
    y: u64,
}

/// One cuBLASLt handle bound to the device's stream, its workspace and the plan cache.
pub struct Gemm {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    plans: HashMap<PlanKey, Plan>,
    tuning: Tuning,
    choices: SharedChoices,
    records: Vec<TuneRecord>,
}

// SAFETY: the handle is only used through &mut self, on the one stream of its device.
unsafe impl Send for Gemm {}

impl Drop for Gemm {
    fn drop(&mut self) {
        self.plans.clear();
        // SAFETY: created in `new`, destroyed once. A failure at teardown has no remedy and
        // nobody to report to (Drop), so it is ignored.
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
            tuning: Tuning::Heuristic,
            choices: SharedChoices::default(),
            records: Vec::new(),
        })
    }

    /// How shapes met from now on choose their algorithm; measured choices are read from and
    /// added to `choices`.
    pub fn set_tuning(&mut self, tuning: Tuning, choices: &SharedChoices) {
        self.tuning = tuning;
        self.choices = choices.clone();
    }

    /// What measuring chose, one record per measured shape.
    pub fn tune_records(&self) -> &[TuneRecord] {
        &self.records
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
            let mut plan = self.make_plan(key)?;
            if self.tuning == Tuning::Measure {
                if let Some(algo) = self.choices.get(&key) {
                    plan.algo = algo;
                } else if plan.candidates.len() > 1 {
                    let args = GemmArgs { x, w, bias, y };
                    if let Some(record) = self.measure(dev, key, &mut plan, args)? {
                        self.records.push(record);
                        self.choices.put(key, plan.algo);
                    }
                }
            }
            self.plans.insert(key, plan);
        }
        let plan = &self.plans[&key];
        self.launch(dev, key, plan, &plan.algo, GemmArgs { x, w, bias, y })
    }

    /// Times every candidate of `plan` on the call's buffers and keeps the fastest in
    /// `plan.algo`. Skipped (None) while the stream is being captured into a graph, and when the
    /// output overlaps an input (repeating the product would then change it).
    fn measure(
        &self,
        dev: &CudaDevice,
        key: PlanKey,
        plan: &mut Plan,
        args: GemmArgs,
    ) -> Result<Option<TuneRecord>, CudaError> {
        use cudarc::driver::sys::{CUevent_flags, CUstreamCaptureStatus};
        if dev.stream.capture_status()? != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Ok(None);
        }
        let elem = match key.out {
            OutType::Bf16 => 2u64,
            OutType::F32 => 4,
        };
        let y_range = args.y..args.y + (key.m * key.n) as u64 * elem;
        let overlaps =
            |start: u64, len: usize| start < y_range.end && y_range.start < start + len as u64;
        if overlaps(args.x, key.m * key.k * 2)
            || overlaps(args.w, key.n * key.k * 2)
            || args
                .bias
                .is_some_and(|b| overlaps(b, key.n * elem as usize))
        {
            return Ok(None);
        }
        let start = dev.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let end = dev.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let mut times = Vec::with_capacity(plan.candidates.len());
        for algo in &plan.candidates {
            // A candidate the library lists but cannot run on these pointers is skipped.
            if self.launch(dev, key, plan, algo, args).is_err() {
                times.push(f64::INFINITY);
                continue;
            }
            start.record(&dev.stream)?;
            for _ in 0..TUNING_REPS {
                self.launch(dev, key, plan, algo, args)?;
            }
            end.record(&dev.stream)?;
            end.synchronize()?;
            times.push(start.elapsed_ms(&end)? as f64 / TUNING_REPS as f64);
        }
        let (chosen, chosen_ms) = times
            .iter()
            .copied()
            .enumerate()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or((0, f64::INFINITY));
        if !chosen_ms.is_finite() {
            return Ok(None);
        }
        plan.algo = plan.candidates[chosen];
        Ok(Some(TuneRecord {
            m: key.m,
            n: key.n,
            k: key.k,
            epilogue: key.epilogue,
            candidates: plan.candidates.len(),
            first_ms: times[0],
            chosen_ms,
            chosen,
        }))
    }

    fn launch(
        &self,
        dev: &CudaDevice,
        key: PlanKey,
        plan: &Plan,
        algo: &sys::cublasLtMatmulAlgo_t,
        args: GemmArgs,
    ) -> Result<(), CudaError> {
        let GemmArgs { x, w, bias, y } = args;
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
                algo as *const _,
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
            candidates: Vec::new(),
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
        let wanted = match self.tuning {
            Tuning::Heuristic => 1,
            Tuning::Measure => TUNING_CANDIDATES,
        };
        // SAFETY: plain old data, written by the heuristic call.
        let mut results: Vec<sys::cublasLtMatmulHeuristicResult_t> =
            vec![unsafe { mem::zeroed() }; wanted];
        let mut found = 0i32;
        // SAFETY: descriptors created above; `results` holds `wanted` entries; the preference is
        // destroyed right after.
        let status = unsafe {
            let r = lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws) as *const usize as *const c_void,
                mem::size_of::<usize>(),
            )
            .and_then(|_| {
                sys::cublasLtMatmulAlgoGetHeuristic(
                    self.handle,
                    desc,
                    a,
                    b,
                    c,
                    c,
                    pref,
                    wanted as i32,
                    results.as_mut_ptr(),
                    &mut found,
                )
                .result()
            });
            // Freeing the preference cannot fail in a way the caller could act on; the search's
            // own result is what matters.
            let _ = lt::destroy_matmul_pref(pref);
            r
        };
        let no_algo = || format!("no algorithm for {m}x{n}x{k} ({epilogue:?}, {out:?} output)");
        status.map_err(|e| lt_err(&no_algo(), e))?;
        plan.candidates = results
            .iter()
            .take(found.max(0) as usize)
            .filter(|r| r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .map(|r| r.algo)
            .collect();
        plan.algo = *plan
            .candidates
            .first()
            .ok_or_else(|| CudaError::Invalid(format!("cuBLASLt: {}", no_algo())))?;
        Ok(plan)
    }
}
