//! The book's chapters, compiled and run as doctests: a sample that stops
//! compiling or asserting fails `cargo test`.

#[doc = include_str!("../book/src/introduction.md")]
pub struct Introduction;

#[doc = include_str!("../book/src/getting-started.md")]
pub struct GettingStarted;

#[doc = include_str!("../book/src/runtime.md")]
pub struct Runtime;

#[doc = include_str!("../book/src/launching.md")]
pub struct Launching;

#[doc = include_str!("../book/src/several-hosts.md")]
pub struct SeveralHosts;

#[doc = include_str!("../book/src/lowerings.md")]
pub struct Lowerings;

#[doc = include_str!("../book/src/placements.md")]
pub struct Placements;

#[doc = include_str!("../book/src/sharded.md")]
pub struct Sharded;

#[doc = include_str!("../book/src/tensor-parallel.md")]
pub struct TensorParallel;

#[doc = include_str!("../book/src/moe.md")]
pub struct Moe;

#[doc = include_str!("../book/src/checkpoints.md")]
pub struct Checkpoints;

#[doc = include_str!("../book/src/models.md")]
pub struct Models;

#[doc = include_str!("../book/src/generation-measured.md")]
pub struct GenerationMeasured;

#[doc = include_str!("../book/src/writing-a-model.md")]
pub struct WritingAModel;

#[doc = include_str!("../book/src/meshes.md")]
pub struct MeshesAndPipelines;

#[doc = include_str!("../book/src/pipelines.md")]
pub struct Pipelines;

#[doc = include_str!("../book/src/layouts-measured.md")]
pub struct LayoutsMeasured;

#[doc = include_str!("../book/src/training.md")]
pub struct Training;

#[doc = include_str!("../book/src/design.md")]
pub struct Design;

#[doc = include_str!("../book/src/design-typed.md")]
pub struct DesignTyped;

#[doc = include_str!("../book/src/design-models.md")]
pub struct DesignModels;

#[doc = include_str!("../README.md")]
pub struct Readme;

#[doc = include_str!("../book/src/quantized.md")]
pub struct Quantized;

#[doc = include_str!("../book/src/quantized-moe.md")]
pub struct QuantizedMoe;
