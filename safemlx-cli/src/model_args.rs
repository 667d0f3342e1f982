//! The options the subcommands share: which model, how its weights are
//! held, where an MoE's experts go, how it splits over the ranks (the
//! mesh), and the backend, and loading it; and how tokens are drawn.

use std::path::PathBuf;
use std::time::Instant;

use safemlx::{Device, DeviceType, Stream};
use safemlx_dist::models::{
    load_layout, Layout, LoadOptions, Placed, StageSplit, Storage, TensorSplit,
};
use safemlx_dist::nn::ExpertPlacement;
use safemlx_dist::typed::MeshSpec;
use safemlx_dist::{Backend, Group};

/// Which model and how to hold it.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelArgs {
    /// A Hugging Face model directory or a .gguf file [default:
    /// SmolLM2-135M-Instruct (Q4_1 GGUF) in the cache, which `cargo xtask
    /// demo` fetches]
    #[arg(long, value_name = "DIR|FILE.gguf")]
    pub model: Option<PathBuf>,
    /// How quantized weights are held: `auto` dequantizes them on a CPU
    /// stream when the float weights fit in memory (about twice as fast
    /// there), `as-stored` keeps them quantized, `float` always
    /// dequantizes
    #[arg(long, value_enum, default_value_t = Weights::Auto)]
    pub weights: Weights,
    /// Where an MoE model's experts go
    #[arg(long, value_enum, default_value_t = Experts::Parallel)]
    pub experts: Experts,
    /// The mesh's axes: pipeline stages (pp) x tensor-parallel ranks per
    /// stage (tp); stage k is ranks k*T..(k+1)*T [default: tp=all ranks]
    #[arg(long, value_name = "pp=P,tp=T")]
    pub mesh: Option<MeshSpec>,
    /// Layers per pipeline stage in proportion to these weights, one per
    /// stage, or to each stage's free memory (`memory`;
    /// SAFEMLX_DIST_MEMORY overrides what a rank reports) [default: even]
    #[arg(long, value_name = "W1:W2:..|memory", allow_hyphen_values = true)]
    pub split: Option<StageSplit>,
    /// Attention heads, hidden columns and experts per tensor-parallel
    /// rank (of each stage) in proportion to these weights, one per rank,
    /// or to each rank's free memory (`memory`) [default: even]
    #[arg(long, value_name = "W1:W2:..|memory", allow_hyphen_values = true)]
    pub tensor_split: Option<TensorSplit>,
    /// MLX's distributed backend
    #[arg(long, env = "SAFEMLX_DIST_BACKEND", default_value = "ring")]
    pub backend: String,
}

/// How tokens are drawn (`generate` and `chat`).
#[derive(Debug, Clone, clap::Args)]
pub struct SamplingArgs {
    /// Sampling temperature (0: greedy)
    #[arg(long, default_value_t = 0.0, value_parser = temperature)]
    pub temperature: f32,
    /// Nucleus sampling: the smallest set of tokens whose probability
    /// reaches P
    #[arg(long, default_value_t = 1.0, value_name = "P", value_parser = top_p)]
    pub top_p: f32,
    /// The sampler's seed
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// `--weights`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Weights {
    /// float32 on a CPU stream when it fits in memory, else as stored
    Auto,
    /// As the checkpoint stores them (quantized stays quantized)
    AsStored,
    /// Dequantized to float32
    Float,
}

/// `--experts`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Experts {
    /// Experts split across ranks (all_to_all_v)
    Parallel,
    /// Every expert sliced across ranks (all_sum)
    TensorParallel,
}

/// A stream on the CPU device (the device this build computes on).
pub fn cpu_stream() -> Stream {
    Stream::new_with_device(&Device::new(DeviceType::Cpu, 0))
}

fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1 << 20) as f64)
}

impl ModelArgs {
    /// The model's path, checked to exist.
    ///
    /// # Errors
    /// A path that does not exist, with the flag that sets it.
    pub fn path(&self) -> Result<PathBuf, String> {
        let path = self
            .model
            .clone()
            .unwrap_or_else(safemlx_dist::models::default_model_path);
        if !path.exists() {
            return Err(format!(
                "model {} does not exist; give --model DIR|FILE.gguf, or run `cargo xtask demo`, which fetches {} into the cache",
                path.display(),
                safemlx_dist::models::DEFAULT_MODEL
            ));
        }
        Ok(path)
    }

    /// The backend `--backend` names.
    ///
    /// # Errors
    /// An unknown name.
    pub fn backend(&self) -> Result<Backend, String> {
        self.backend
            .parse()
            .map_err(|e: safemlx_dist::Error| format!("--backend: {e}"))
    }

    /// The model's name for clients: the file or directory name.
    pub fn name(&self) -> Result<String, String> {
        let path = self.path()?;
        Ok(path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        ))
    }

    /// Loads this rank's part of the model as the mesh splits it: rank 0
    /// says how its weights are held and how to choose the other way, and
    /// with several ranks every rank says what it holds.
    ///
    /// # Errors
    /// The layout's and the model's reading errors.
    pub fn load(&self, group: &Group, s: &Stream) -> Result<Placed, crate::failure::Failure> {
        let path = self.path()?;
        let experts = match self.experts {
            Experts::Parallel => ExpertPlacement::ExpertParallel,
            Experts::TensorParallel => ExpertPlacement::ExpertTensorParallel,
        };
        let started = Instant::now();
        // Every rank of a host may hold its share: keep half free.
        let available = available_memory();
        let weights = match self.weights {
            Weights::Float => Storage::Dequantized,
            Weights::AsStored => Storage::AsStored,
            Weights::Auto => Storage::FloatUpTo(available.map_or(0, |a| a / 2)),
        };
        let layout = Layout {
            mesh: self.mesh.unwrap_or_default(),
            split: self.split.clone(),
            tensor_split: self.tensor_split.clone(),
        };
        let options = LoadOptions {
            weights,
            experts,
            tensor_split: None,
        };
        let placed = load_layout(group, &path, options, &layout, s)?;
        for note in &placed.notes {
            eprintln!("safemlx: {note}");
        }
        let loaded = &placed.loaded;
        let float = loaded.model.config().float_bytes();
        let available = available.map_or_else(|| "unknown memory".to_owned(), mib);
        let quantized = loaded.model.is_quantized();
        let mut said = match (self.weights, quantized) {
            (Weights::Float, _) => "float32 (--weights float)".to_owned(),
            (Weights::AsStored, true) => "quantized, as stored (--weights as-stored)".to_owned(),
            (Weights::Auto, true) => format!(
                "quantized, as stored: the float weights ({}) do not fit in half of the {available} available (--weights float dequantizes anyway)",
                mib(float)
            ),
            (Weights::Auto, false) => format!(
                "float32: on a CPU stream it computes about twice as fast as quantized weights, and its {} fit in half of the {available} available (--weights as-stored keeps quantized weights quantized)",
                mib(float)
            ),
            (Weights::AsStored, false) => "as stored (float)".to_owned(),
        };
        let (rank, n) = (group.rank(), group.size());
        if n > 1 {
            said.push_str(&format!(", split over {n} ranks ({})", placed.axes));
        }
        if rank == 0 {
            eprintln!(
                "safemlx: {} loaded in {:.1} s; weights {said}",
                path.display(),
                started.elapsed().as_secs_f64()
            );
        }
        if n > 1 {
            eprintln!(
                "safemlx: rank {rank}/{n}: {}; read {} of weights, holds {}",
                loaded.model.holds(),
                mib(loaded.weights.bytes_read()),
                mib(loaded.model.weight_bytes() as u64)
            );
        }
        Ok(placed)
    }
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `--temperature`: a finite number, 0 or above (checked before the model
/// loads).
fn temperature(text: &str) -> Result<f32, String> {
    let t: f32 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if t.is_finite() && t >= 0.0 {
        Ok(t)
    } else {
        Err(format!(
            "{text} is not a temperature: give 0 (greedy) or a positive number"
        ))
    }
}

/// `--top-p`: above 0 and at most 1.
fn top_p(text: &str) -> Result<f32, String> {
    let p: f32 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if p > 0.0 && p <= 1.0 {
        Ok(p)
    } else {
        Err(format!("{text} is not a probability above 0 and at most 1"))
    }
}
