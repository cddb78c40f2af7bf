//! # kvq-gpu
//!
//! The CUDA backend of kvq: encode-on-write into paged compressed blocks and fused paged decode
//! attention that reads those blocks directly, on an NVIDIA GPU. Kernels are CUDA C++ strings
//! compiled at run time by NVRTC and loaded through the driver API (cudarc with dynamic
//! loading), so the same binary runs without CUDA: [`libraries`] says what was found, and
//! [`Gpu::open`] returns `None` when there is no usable GPU.
//!
//! The device cache is a pool of pages, each holding, for every KV head, the key blocks of
//! `page_tokens` tokens, then for every KV head the value blocks (the CPU cache, kvq-cache,
//! keeps the same pages head-major in two arenas); each block is the CPU codec's block byte
//! for byte. This crate knows nothing of the
//! CPU kernels: it reads the codecs only for their layout and parameters (rotations, codebooks).

mod scheme;

pub use scheme::RoleLayout;

use anyhow::{anyhow, ensure, Context, Result};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use std::sync::Arc;

/// The kernels' CUDA source (without the per-scheme prelude).
const KERNELS: &str = include_str!("kernels.cu");

/// Which CUDA libraries the dynamic loader found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Libraries {
    /// The driver (`libcuda.so.1`).
    pub cuda: bool,
    /// The run-time compiler (`libnvrtc.so.13`).
    pub nvrtc: bool,
}

/// Looks for libcuda and libnvrtc without loading anything else (cudarc panics on first use
/// of a library it cannot find, so check this first).
pub fn libraries() -> Libraries {
    // SAFETY: these only try to dlopen the candidate names and drop the handles.
    unsafe {
        Libraries {
            cuda: cudarc::driver::sys::is_culib_present(),
            nvrtc: cudarc::nvrtc::sys::is_culib_present(),
        }
    }
}

/// A GPU with a context and one stream.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
}

/// Device facts for `kvq gpu-info`.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// Device name.
    pub name: String,
    /// Total memory in bytes.
    pub total_bytes: usize,
    /// Free memory in bytes.
    pub free_bytes: usize,
    /// Compute capability (major, minor).
    pub capability: (i32, i32),
    /// Streaming multiprocessors.
    pub multiprocessors: i32,
}

impl Gpu {
    /// Opens device 0, or returns `None` (with the reason) when libcuda or libnvrtc is missing
    /// or no device answers.
    pub fn open() -> std::result::Result<Self, String> {
        let libs = libraries();
        if !libs.cuda || !libs.nvrtc {
            return Err(format!(
                "no CUDA: libcuda {}, libnvrtc {}",
                if libs.cuda { "found" } else { "missing" },
                if libs.nvrtc { "found" } else { "missing" }
            ));
        }
        let ctx = CudaContext::new(0).map_err(|e| format!("no usable CUDA device: {e}"))?;
        let stream = ctx.default_stream();
        Ok(Self { ctx, stream })
    }

    /// The stream every operation of this crate runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Name, memory, compute capability and multiprocessors of the device.
    pub fn info(&self) -> Result<DeviceInfo> {
        let (free_bytes, total_bytes) = self.ctx.mem_get_info()?;
        let multiprocessors = self.ctx.attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )?;
        Ok(DeviceInfo {
            name: self.ctx.name()?,
            total_bytes,
            free_bytes,
            capability: self.ctx.compute_capability()?,
            multiprocessors,
        })
    }

    /// Compiles a small kernel, runs it on 1024 values and checks the result; returns the
    /// largest error (0 when correct).
    pub fn self_test(&self) -> Result<f32> {
        let f16 = kvq_codec::SchemeKind::F16;
        let codec = kvq_codec::build_codec(f16, kvq_codec::Role::Key, 128, &Default::default(), 0)?;
        let probe = RoleLayout::new(f16, kvq_codec::Role::Key, codec.as_ref())?;
        let shape = CacheShape {
            kv_heads: 1,
            q_heads: 1,
            head_dim: 128,
            page_tokens: 32,
        };
        let module = self
            .ctx
            .load_module(compile(&prelude(shape, &probe, &probe))?)?;
        let f = module.load_function("self_test")?;
        let x: Vec<f32> = (0..1024).map(|i| i as f32 * 0.37 - 100.0).collect();
        let dx = self.stream.clone_htod(&x)?;
        let mut dy = self.stream.alloc_zeros::<f32>(x.len())?;
        let n = x.len() as i32;
        let mut launch = self.stream.launch_builder(&f);
        launch.arg(&dx).arg(&mut dy).arg(&n);
        // SAFETY: the kernel reads n floats of dx and writes n floats of dy, both n long.
        unsafe { launch.launch(LaunchConfig::for_num_elems(x.len() as u32)) }?;
        let y = self.stream.clone_dtoh(&dy)?;
        Ok(x.iter()
            .zip(&y)
            .map(|(a, b)| (2.0 * half::f16::from_f32(*a).to_f32() - b).abs())
            .fold(0.0, f32::max))
    }

    /// Device-to-device copy bandwidth: bytes read plus bytes written per second, median of
    /// 10 copies of `bytes` bytes.
    pub fn copy_bandwidth(&self, bytes: usize) -> Result<f64> {
        let src = self.stream.alloc_zeros::<u8>(bytes)?;
        let mut dst = self.stream.alloc_zeros::<u8>(bytes)?;
        let mut times = Vec::new();
        for _ in 0..12 {
            let ms = self.time(|| Ok(self.stream.memcpy_dtod(&src, &mut dst)?))?;
            times.push(ms);
        }
        Ok(2.0 * bytes as f64 / (median(&mut times[2..].to_vec()) * 1e-3))
    }

    /// Milliseconds `work` takes on the stream, by device events.
    pub fn time(&self, work: impl FnOnce() -> Result<()>) -> Result<f64> {
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.ctx.new_event(flags)?;
        let end = self.ctx.new_event(flags)?;
        start.record(&self.stream)?;
        work()?;
        end.record(&self.stream)?;
        end.synchronize()?;
        Ok(f64::from(start.elapsed_ms(&end)?))
    }
}

/// The median of `xs` (sorted in place).
pub fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// NVRTC-compiles the kernels with `prelude` for sm_90 (usable without a GPU: only libnvrtc
/// is needed).
pub fn compile(prelude: &str) -> Result<cudarc::nvrtc::Ptx> {
    let opts = CompileOptions {
        arch: Some("sm_90"),
        options: vec!["-std=c++17".into()],
        ..Default::default()
    };
    compile_ptx_with_opts(format!("{prelude}\n{KERNELS}"), opts)
        .map_err(|e| anyhow!("NVRTC: {e:?}"))
}

/// The NVRTC prelude of a scheme's kernels for `shape` with the default [`Tuning`].
pub fn prelude(shape: CacheShape, k: &RoleLayout, v: &RoleLayout) -> String {
    prelude_tuned(shape, k, v, Tuning::default())
}

/// The NVRTC prelude of a scheme's kernels for `shape` and `tuning`: the geometry (with `KD`
/// and `VD`, the lengths of the prepared query and of the value accumulator), the attention
/// kernel's occupancy target (`MINB` blocks per multiprocessor, its launch bound) and cp.async
/// pipeline depth (`NSTAGE`, see [`stages`]), and both layouts.
pub fn prelude_tuned(shape: CacheShape, k: &RoleLayout, v: &RoleLayout, tuning: Tuning) -> String {
    format!(
        "#define HD {}\n#define KD {}\n#define VD {}\n#define GQ {}\n#define PT {}\n#define MINB {}\n#define NSTAGE {}\n{}{}",
        shape.head_dim,
        k.logical_dim(),
        v.logical_dim(),
        shape.q_heads / shape.kv_heads,
        shape.page_tokens,
        tuning.min_blocks,
        stages(shape, k, v, tuning),
        k.prelude("KS"),
        v.prelude("VS")
    )
}

/// Warps of one attention block.
const WARPS: usize = 4;

/// Shared memory of a multiprocessor that the attention blocks' stages may share, the most one
/// block takes, and what each block needs besides (static shared memory: at most ~24 KiB, with
/// the turbo pair tables; the 1 KiB the driver reserves per block).
const SM_STAGE_BUDGET: usize = 220 << 10;
const BLOCK_STAGE_CAP: usize = 64 << 10;
const BLOCK_STATIC: usize = 25 << 10;

/// Bytes of one 16-token warp step that the attention kernel stages in shared memory (keys and
/// values; f16/bf16 rows are read from global memory and stage nothing).
fn step_bytes(shape: CacheShape, k: &RoleLayout, v: &RoleLayout) -> usize {
    k.stage_bytes(shape.head_dim) + v.stage_bytes(shape.head_dim)
}

/// Depth of the attention kernel's cp.async ring (steps per warp, 2 to 8): as many as fit in
/// the shared memory of `tuning.min_blocks` resident blocks per multiprocessor.
pub fn stages(shape: CacheShape, k: &RoleLayout, v: &RoleLayout, tuning: Tuning) -> usize {
    let step = step_bytes(shape, k, v);
    if step == 0 {
        return 2;
    }
    let budget = (SM_STAGE_BUDGET / tuning.min_blocks.max(1))
        .saturating_sub(BLOCK_STATIC)
        .min(BLOCK_STAGE_CAP);
    (budget / (WARPS * step)).clamp(2, 8)
}

/// Dynamic shared memory of one attention block: the warps' rings of staged steps, plus 16
/// spare bytes (the kernel's word-wise decode may read one word past a run).
fn stage_smem(shape: CacheShape, k: &RoleLayout, v: &RoleLayout, tuning: Tuning) -> usize {
    match step_bytes(shape, k, v) {
        0 => 0,
        step => WARPS * stages(shape, k, v, tuning) * step + 16,
    }
}

/// Geometry of a paged device cache (one layer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheShape {
    /// KV heads.
    pub kv_heads: usize,
    /// Query heads (a multiple of `kv_heads`).
    pub q_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Tokens per page (a multiple of both layouts' block tokens).
    pub page_tokens: usize,
}

/// Kernel tuning: how finely the context is split across blocks, and the occupancy the
/// attention kernel is compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// Attention blocks (4 warps each) to launch per multiprocessor; the context of each
    /// sequence is split until the grid has about this many per multiprocessor.
    pub blocks_per_sm: usize,
    /// Blocks that should be resident per multiprocessor at once (the kernel's launch bound:
    /// 4 caps registers at 128 per thread; 3 at 168). The cp.async ring is sized to fit.
    pub min_blocks: usize,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            blocks_per_sm: 8,
            min_blocks: 3,
        }
    }
}

impl Tuning {
    /// Short label for reports, e.g. `sm8` (`-o4` appended when `min_blocks` is not 3).
    pub fn label(&self) -> String {
        if self.min_blocks == 3 {
            format!("sm{}", self.blocks_per_sm)
        } else {
            format!("sm{}-o{}", self.blocks_per_sm, self.min_blocks)
        }
    }
}

/// Compiled kernels for one scheme (K and V layouts) and cache shape.
pub struct PagedKernels {
    shape: CacheShape,
    tuning: Tuning,
    k: RoleLayout,
    v: RoleLayout,
    /// The query's preparation matrix (`KD × head_dim`): the keys' [`RoleLayout::rotation`],
    /// or the identity.
    q_mat: CudaSlice<f32>,
    k_rot: Option<CudaSlice<f32>>,
    v_rot: Option<CudaSlice<f32>>,
    encode_k: CudaFunction,
    encode_v: CudaFunction,
    partial: CudaFunction,
    /// Dynamic shared memory of one attention block (the cp.async rings).
    stage_smem: usize,
    merge: CudaFunction,
    matrix: CudaFunction,
    fill: CudaFunction,
}

/// Scratch buffers of one attention call, reusable across steps of the same batch.
pub struct AttnScratch {
    q: CudaSlice<f32>,
    part_acc: CudaSlice<f32>,
    part_ml: CudaSlice<f32>,
    rotated_out: CudaSlice<f32>,
    splits: usize,
    split_tokens: usize,
}

impl PagedKernels {
    /// Compiles the kernels for keys in layout `k`, values in layout `v`.
    pub fn new(
        gpu: &Gpu,
        shape: CacheShape,
        k: RoleLayout,
        v: RoleLayout,
        tuning: Tuning,
    ) -> Result<Self> {
        let CacheShape {
            kv_heads,
            q_heads,
            head_dim,
            page_tokens,
        } = shape;
        ensure!(
            kv_heads > 0 && q_heads.is_multiple_of(kv_heads),
            "KV heads must divide query heads"
        );
        ensure!(
            page_tokens.is_multiple_of(k.block_tokens())
                && page_tokens.is_multiple_of(v.block_tokens()),
            "page_tokens must be a multiple of the codecs' block tokens"
        );
        ensure!(
            q_heads / kv_heads <= 8,
            "the tensor-core kernel takes at most 8 query heads per KV head"
        );
        ensure!(
            head_dim.is_multiple_of(64),
            "the tensor-core kernel needs head_dim a multiple of 64"
        );
        ensure!(
            k.logical_dim() <= 256 && v.logical_dim() <= 256,
            "the tensor-core kernel takes prepared queries and value accumulators of at most 256 \
             (TurboQuant-prod: head_dim at most 128)"
        );
        ensure!(
            page_tokens.is_multiple_of(16),
            "page_tokens must be a multiple of 16"
        );
        ensure!(tuning.blocks_per_sm > 0, "blocks_per_sm must be positive");
        ensure!(
            (1..=8).contains(&tuning.min_blocks),
            "min_blocks must be 1 to 8"
        );
        let head_bytes = |l: &RoleLayout| page_tokens / l.block_tokens() * l.block_bytes();
        ensure!(
            head_bytes(&k).is_multiple_of(16) && head_bytes(&v).is_multiple_of(16),
            "each head's run of blocks in a page must be a multiple of 16 bytes (aligned loads)"
        );
        let module = gpu
            .ctx
            .load_module(compile(&prelude_tuned(shape, &k, &v, tuning))?)?;
        let partial = module.load_function("attn_partial")?;
        let smem = stage_smem(shape, &k, &v, tuning);
        partial.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            i32::try_from(smem)?,
        )?;
        let rot = |l: &RoleLayout| -> Result<Option<CudaSlice<f32>>> {
            Ok(match l.rotation() {
                Some(r) => Some(gpu.stream.clone_htod(r)?),
                None => None,
            })
        };
        let q_mat = match k.rotation() {
            Some(r) => gpu.stream.clone_htod(r)?,
            None => {
                let mut id = vec![0f32; head_dim * head_dim];
                (0..head_dim).for_each(|i| id[i * head_dim + i] = 1.0);
                gpu.stream.clone_htod(&id)?
            }
        };
        Ok(Self {
            shape,
            tuning,
            q_mat,
            k_rot: rot(&k)?,
            v_rot: rot(&v)?,
            k,
            v,
            encode_k: module.load_function("encode_k")?,
            encode_v: module.load_function("encode_v")?,
            partial,
            stage_smem: smem,
            merge: module.load_function("attn_merge")?,
            matrix: module.load_function("apply_matrix")?,
            fill: module.load_function("fill_uniform")?,
        })
    }

    /// Bytes of one head's keys in a page.
    pub fn k_head_bytes(&self) -> usize {
        self.shape.page_tokens / self.k.block_tokens() * self.k.block_bytes()
    }

    /// Bytes of one head's values in a page.
    pub fn v_head_bytes(&self) -> usize {
        self.shape.page_tokens / self.v.block_tokens() * self.v.block_bytes()
    }

    /// Bytes of one page (every head's keys, then every head's values).
    pub fn page_bytes(&self) -> usize {
        self.shape.kv_heads * (self.k_head_bytes() + self.v_head_bytes())
    }

    /// Encodes keys and values of `n_tok` tokens at positions `first_pos..` of `batch`
    /// sequences (`k`, `v`: `[batch][n_tok][kv_heads][head_dim]` f32) into the pages their
    /// block tables (`[batch][max_pages]`) name. `first_pos` and `n_tok` must be multiples of
    /// both layouts' block tokens (stage rows until a block is full).
    #[allow(clippy::too_many_arguments)]
    pub fn encode(
        &self,
        gpu: &Gpu,
        pool: &mut CudaSlice<u8>,
        block_table: &CudaSlice<i32>,
        max_pages: usize,
        batch: usize,
        first_pos: usize,
        n_tok: usize,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
    ) -> Result<()> {
        let s = self.shape;
        for (layout, f, rows, rot) in [
            (&self.k, &self.encode_k, k, &self.k_rot),
            (&self.v, &self.encode_v, v, &self.v_rot),
        ] {
            let bt = layout.block_tokens();
            ensure!(
                first_pos.is_multiple_of(bt) && n_tok.is_multiple_of(bt),
                "encode needs whole blocks of {bt} tokens"
            );
            ensure!(
                rows.len() >= batch * n_tok * s.kv_heads * s.head_dim,
                "rows too short"
            );
            let (nt, fp, mp, nkv) = (
                n_tok as i32,
                first_pos as i32,
                max_pages as i32,
                s.kv_heads as i32,
            );
            let (pb, kb, vb) = (
                self.page_bytes() as u64,
                self.k_head_bytes() as u64,
                self.v_head_bytes() as u64,
            );
            let dummy;
            let rot = match rot {
                Some(r) => r,
                None => {
                    dummy = gpu.stream.alloc_zeros::<f32>(1)?;
                    &dummy
                }
            };
            let mut launch = gpu.stream.launch_builder(f);
            launch
                .arg(rows)
                .arg(&nt)
                .arg(&fp)
                .arg(block_table)
                .arg(&mp)
                .arg(&mut *pool)
                .arg(&pb)
                .arg(&kb)
                .arg(&vb)
                .arg(&nkv)
                .arg(rot);
            let cfg = LaunchConfig {
                grid_dim: ((n_tok / bt) as u32, s.kv_heads as u32, batch as u32),
                block_dim: (s.head_dim as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the kernel reads batch·n_tok rows of kv_heads·head_dim floats (checked
            // above) and writes whole blocks inside the pages the block table names; the
            // caller's block table holds valid page ids of `pool` for these positions.
            unsafe { launch.launch(cfg) }?;
        }
        Ok(())
    }

    /// Fills `rows` with uniform random values in [-1, 1) (benchmark caches).
    pub fn fill_uniform(&self, gpu: &Gpu, rows: &mut CudaSlice<f32>, seed: u64) -> Result<()> {
        let n = rows.len() as u64;
        let mut launch = gpu.stream.launch_builder(&self.fill);
        launch.arg(&mut *rows).arg(&n).arg(&seed);
        let cfg = LaunchConfig {
            grid_dim: (1024, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: grid-stride loop over exactly n = rows.len() floats.
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }

    /// Length of the prepared query (`KD`).
    fn kd(&self) -> usize {
        self.k.logical_dim()
    }

    /// Length of the value accumulator (`VD`).
    fn vd(&self) -> usize {
        self.v.logical_dim()
    }

    /// Scratch for `batch` sequences of up to `max_ctx` tokens on a device with `sms`
    /// multiprocessors: the context is split so that about `blocks_per_sm` blocks per
    /// multiprocessor run.
    pub fn scratch(
        &self,
        gpu: &Gpu,
        batch: usize,
        max_ctx: usize,
        sms: usize,
    ) -> Result<AttnScratch> {
        let s = self.shape;
        let wanted = (self.tuning.blocks_per_sm * sms)
            .div_ceil(batch * s.kv_heads)
            .max(1);
        let split_tokens = max_ctx.div_ceil(wanted).next_multiple_of(64).max(64);
        let splits = max_ctx.div_ceil(split_tokens).max(1);
        let rows = batch * s.q_heads;
        Ok(AttnScratch {
            q: gpu.stream.alloc_zeros(rows * self.kd())?,
            part_acc: gpu.stream.alloc_zeros(rows * splits * self.vd())?,
            part_ml: gpu.stream.alloc_zeros(rows * splits * 2)?,
            rotated_out: gpu.stream.alloc_zeros(rows * self.vd())?,
            splits,
            split_tokens,
        })
    }

    /// Decode attention of one query token per sequence: `q` is `[batch][q_heads][head_dim]`
    /// (not yet scaled), `out` the same shape; `seq_lens` the tokens of each sequence (all
    /// ≤ the scratch's `max_ctx`); `scale` multiplies `q·k` before the softmax.
    #[allow(clippy::too_many_arguments)]
    pub fn attend(
        &self,
        gpu: &Gpu,
        pool: &CudaSlice<u8>,
        block_table: &CudaSlice<i32>,
        max_pages: usize,
        seq_lens: &CudaSlice<i32>,
        batch: usize,
        q: &CudaSlice<f32>,
        scale: f32,
        scratch: &mut AttnScratch,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let s = self.shape;
        let rows = batch * s.q_heads;
        ensure!(
            q.len() >= rows * s.head_dim && out.len() >= rows * s.head_dim,
            "q/out too short"
        );
        ensure!(
            scratch.q.len() >= rows * self.kd(),
            "scratch sized for a smaller batch"
        );
        let factor = scale * std::f32::consts::LOG2_E;
        // Prepared query: M·q (Π·q for rotated keys, [Π; S]·q for TurboQuant-prod), scaled by
        // scale·log2(e).
        self.matrix_rows(
            gpu,
            &self.q_mat,
            (q, s.head_dim),
            (&mut scratch.q, self.kd()),
            rows,
            false,
            factor,
        )?;
        let (pb, kb, vb) = (
            self.page_bytes() as u64,
            self.k_head_bytes() as u64,
            self.v_head_bytes() as u64,
        );
        let (nkv, mp, sp, st) = (
            s.kv_heads as i32,
            max_pages as i32,
            scratch.splits as i32,
            scratch.split_tokens as i32,
        );
        let mut launch = gpu.stream.launch_builder(&self.partial);
        launch
            .arg(pool)
            .arg(&pb)
            .arg(&kb)
            .arg(&vb)
            .arg(&nkv)
            .arg(block_table)
            .arg(&mp)
            .arg(seq_lens)
            .arg(&scratch.q)
            .arg(&mut scratch.part_acc)
            .arg(&mut scratch.part_ml)
            .arg(&sp)
            .arg(&st);
        let cfg = LaunchConfig {
            grid_dim: (scratch.splits as u32, s.kv_heads as u32, batch as u32),
            block_dim: (128, 1, 1),
            shared_mem_bytes: self.stage_smem as u32,
        };
        // SAFETY: reads pages named by the block table for positions < seq_lens[b] ≤ max_ctx
        // (splits·split_tokens ≥ max_ctx), writes rows·splits partials, which scratch holds;
        // the dynamic shared memory is the size the kernel's rings need (same NSTAGE and step
        // bytes as its prelude) and the function's limit was raised to it in `new`.
        unsafe { launch.launch(cfg) }?;
        let heads = s.q_heads as i32;
        let target = if self.v_rot.is_some() {
            &mut scratch.rotated_out
        } else {
            &mut *out
        };
        let mut launch = gpu.stream.launch_builder(&self.merge);
        launch
            .arg(&scratch.part_acc)
            .arg(&scratch.part_ml)
            .arg(&mut *target)
            .arg(&heads)
            .arg(&sp);
        let cfg = LaunchConfig {
            grid_dim: (s.q_heads as u32, batch as u32, 1),
            block_dim: (self.vd() as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: reads batch·q_heads·splits partials of VD and writes batch·q_heads rows of VD
        // (head_dim, or into rotated_out, which holds rows·VD).
        unsafe { launch.launch(cfg) }?;
        if let Some(v_rot) = &self.v_rot {
            self.matrix_rows(
                gpu,
                v_rot,
                (&scratch.rotated_out, self.vd()),
                (out, s.head_dim),
                rows,
                true,
                1.0,
            )?;
        }
        Ok(())
    }

    /// `y[r] = factor·M·x[r]` for `rows` rows of `x` (length `x.1`) into rows of `y` (length
    /// `y.1`): `M` is `y.1 × x.1` row-major, or with `transpose` `Mᵀ` of an `x.1 × y.1` matrix.
    #[allow(clippy::too_many_arguments)]
    fn matrix_rows(
        &self,
        gpu: &Gpu,
        mat: &CudaSlice<f32>,
        x: (&CudaSlice<f32>, usize),
        y: (&mut CudaSlice<f32>, usize),
        rows: usize,
        transpose: bool,
        factor: f32,
    ) -> Result<()> {
        let (x, in_dim) = x;
        let (y, out_dim) = y;
        ensure!(
            mat.len() == in_dim * out_dim && x.len() >= rows * in_dim && y.len() >= rows * out_dim,
            "matrix and rows do not match"
        );
        let tr = i32::from(transpose);
        let (di, dout) = (in_dim as i32, out_dim as i32);
        let mut launch = gpu.stream.launch_builder(&self.matrix);
        launch
            .arg(mat)
            .arg(x)
            .arg(&mut *y)
            .arg(&di)
            .arg(&dout)
            .arg(&tr)
            .arg(&factor);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (out_dim as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: reads an in_dim×out_dim matrix and rows·in_dim inputs, writes rows·out_dim
        // outputs (all checked above); the kernel holds one row of at most 512 inputs in shared
        // memory (logical dims are at most 256, head_dim at most 256).
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }
}

/// Builds the layouts of a scheme's keys and values from the CPU codecs.
pub fn layouts(
    kind_k: kvq_codec::SchemeKind,
    kind_v: kvq_codec::SchemeKind,
    k: &dyn kvq_codec::Codec,
    v: &dyn kvq_codec::Codec,
) -> Result<(RoleLayout, RoleLayout)> {
    Ok((
        RoleLayout::new(kind_k, kvq_codec::Role::Key, k).context("keys")?,
        RoleLayout::new(kind_v, kvq_codec::Role::Value, v).context("values")?,
    ))
}
