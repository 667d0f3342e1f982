//! The crate's one error type.
//!
//! Every message is lowercase, names the values involved and, where there is
//! one, the fix. The runtime's messages are fixed by `spec/runtime.md` and
//! asserted character for character by the tests.

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in `safemlx-dist`.
#[derive(Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A backend name contained a NUL byte.
    #[error("distributed backend name contains an interior NUL byte")]
    BackendNameNul,
    /// A backend name is not one of the five MLX knows.
    #[error("unknown distributed backend {name:?}; expected any, ring, mpi, jaccl, or nccl")]
    UnknownBackend {
        /// The name as given.
        name: String,
    },
    /// MLX reported an error from native code.
    #[error("{operation} failed: {message}")]
    Native {
        /// The MLX-C function that failed.
        operation: &'static str,
        /// MLX's own message.
        message: String,
    },
    /// An MLX array operation (through `safemlx`) failed.
    #[error("mlx operation failed: {}", .0.what())]
    Mlx(#[from] safemlx::error::Exception),
    /// MLX returned a group with an impossible rank or size.
    #[error("mlx returned an invalid distributed group (rank {rank}, size {size})")]
    InvalidNativeGroup {
        /// The rank MLX reported.
        rank: i32,
        /// The size MLX reported.
        size: i32,
    },
    /// `SAFEMLX_DIST_LOWERING` has an unknown value.
    #[error("SAFEMLX_DIST_LOWERING must be native, composed, all_to_all or auto, got {value:?}")]
    InvalidLowering {
        /// The value found.
        value: String,
    },
    /// Ranks of one group were started with different lowerings.
    #[error("ranks disagree on SAFEMLX_DIST_LOWERING (this rank: {this}; the group has {lowest} to {highest}); set the same value on every rank")]
    LoweringMismatch {
        /// This rank's lowering.
        this: &'static str,
        /// One of the values in the group.
        lowest: &'static str,
        /// Another value in the group.
        highest: &'static str,
    },
    /// A rank joined a group over a backend that finds peers by address
    /// without the run's secret.
    #[error("SAFEMLX_DIST_TOKEN is not set, so this rank cannot prove to its peers (a group of {size}) that it belongs to their run; start the ranks with safemlx-launch (a fresh secret per run) or give every rank of the run the same secret of at least 16 characters in SAFEMLX_DIST_TOKEN")]
    MissingToken {
        /// The group's size.
        size: usize,
    },
    /// `SAFEMLX_DIST_TOKEN` is too short to be a secret.
    #[error("SAFEMLX_DIST_TOKEN has {len} bytes; a run's secret needs at least 16 (safemlx-launch makes 64 random hex digits per run)")]
    ShortToken {
        /// Its length in bytes.
        len: usize,
    },
    /// A peer did not prove the run's secret when the group was joined.
    #[error("rank {rank} of this group ({address}) did not prove this run's secret (SAFEMLX_DIST_TOKEN): a process of another run, or another program, answered at that address; runs must not share ports (give each its own hostfile or --starting-port), and ranks started by another launcher need this run's SAFEMLX_DIST_TOKEN")]
    NotAdmitted {
        /// The peer's rank.
        rank: usize,
        /// Where it is.
        address: String,
    },
    /// A `Mesh<N>` was made from a group of another size.
    #[error("this program is written for a mesh of {expected} ranks but was started with {actual}; launch it with -n {expected}")]
    MeshSize {
        /// `N`.
        expected: usize,
        /// The group's size.
        actual: usize,
    },
    /// A size or index does not fit MLX's `i32` shapes.
    #[error("{value} does not fit in an MLX dimension (i32)")]
    ShapeOverflow {
        /// The value.
        value: usize,
    },
    /// A typed operation got an array of the wrong shape; the message says
    /// which operation, what it got and what it needs.
    #[error("{0}")]
    Shape(String),

    /// The tokenizer or the chat template failed: a prompt that does not
    /// tokenize, tokens that do not decode, a template that does not
    /// render or is missing; the message says which.
    #[error("{0}")]
    Tokenizer(String),

    /// A sampling setting out of range (temperature, `top_p`), or logits
    /// that cannot be sampled; the message names the value and the fix.
    #[error("{0}")]
    Sampling(String),

    /// A setting out of range: an environment variable that cannot be
    /// read, or a layer's or an optimizer's option (an MoE's `top_k`, a
    /// clipping norm); the message names it, its value and what it must be.
    #[error("{0}")]
    Setting(String),
    /// `--check` found the split run and one process apart (the message
    /// has both figures), or could not run the one process.
    #[error("{0}")]
    Check(String),

    /// A checkpoint that cannot be read or written, or lacks a tensor.
    #[error("checkpoint {path}: {message}")]
    Checkpoint {
        /// The file.
        path: String,
        /// What is wrong, naming the tensor where there is one.
        message: String,
    },
    /// A model whose configuration, or whose weights against it, cannot be
    /// run: the message names the file, the key or tensor, and the values.
    #[error("model {path}: {message}")]
    Model {
        /// The model's file or directory.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The group size reported by MLX does not fit in `i32`.
    #[error("distributed group size does not fit in i32")]
    GroupSizeOverflow,
    /// `all_gather` would produce a first dimension larger than `i32::MAX`.
    #[error("all-gather output's first dimension exceeds i32")]
    AllGatherOverflow,
    /// `sum_scatter` of a scalar.
    #[error("sum-scatter requires a non-scalar input")]
    SumScatterScalar,
    /// `sum_scatter` of an array with a negative dimension.
    #[error("sum-scatter input shape contains a negative size")]
    SumScatterNegativeShape,
    /// `sum_scatter` along a dimension the group size does not divide.
    #[error("sum-scatter input's first dimension ({dim}) is not divisible by group size ({size})")]
    SumScatterIndivisible {
        /// The input's first dimension.
        dim: i64,
        /// The group size.
        size: usize,
    },
    /// A point-to-point operation on a singleton group.
    #[error("cannot use a {role} rank with a singleton distributed group")]
    PeerOnSingleton {
        /// `destination` or `source`.
        role: PeerRole,
    },
    /// A peer rank outside the group.
    #[error("invalid {role} rank {peer} for distributed group of size {size}")]
    PeerOutOfRange {
        /// `destination` or `source`.
        role: PeerRole,
        /// The rank asked for.
        peer: usize,
        /// The group size.
        size: usize,
    },
    /// A peer rank larger than `i32::MAX`.
    #[error("{role} rank does not fit in i32")]
    PeerOverflow {
        /// `destination` or `source`.
        role: PeerRole,
    },
    /// `recv` with a negative dimension.
    #[error("receive shape dimensions must be non-negative")]
    NegativeReceiveShape,
    /// An `all_to_all_v` argument is invalid; the message says which and why.
    #[error("all_to_all_v {0}")]
    AllToAllV(AllToAllVError),
}

/// Which side of a point-to-point operation a rank is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerRole {
    /// The rank `send` sends to.
    Destination,
    /// The rank `recv` receives from.
    Source,
}

impl std::fmt::Display for PeerRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Destination => "destination",
            Self::Source => "source",
        })
    }
}

/// The ways `all_to_all_v` arguments can be wrong, in the order they are checked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AllToAllVError {
    /// The input is a scalar.
    #[error("input must have a leading row dimension")]
    ScalarInput,
    /// A count slice does not have one entry per rank.
    #[error("requires {size} send counts and receive counts, got {send} and {recv}")]
    CountArity {
        /// The group size.
        size: usize,
        /// `send_counts.len()`.
        send: usize,
        /// `recv_counts.len()`.
        recv: usize,
    },
    /// The send counts add up past `usize::MAX`.
    #[error("send count sum overflowed usize")]
    SendSumOverflow,
    /// The receive counts add up past `usize::MAX`.
    #[error("receive count sum overflowed usize")]
    RecvSumOverflow,
    /// The input's row count is negative.
    #[error("input row count is negative")]
    NegativeRows,
    /// The send counts do not add up to the input's rows.
    #[error("send count sum {sum} does not match input row count {rows}")]
    SendSumMismatch {
        /// `send_counts.iter().sum()`.
        sum: usize,
        /// The input's leading dimension.
        rows: usize,
    },
    /// The output would have more than `i32::MAX` rows.
    #[error("output row count exceeds i32")]
    OutputRowsOverflow,
    /// A trailing dimension is negative.
    #[error("trailing shape is negative")]
    NegativeTrailingShape,
    /// One row's byte size overflows.
    #[error("row byte size overflowed usize")]
    RowBytesOverflow,
    /// The output's byte size overflows.
    #[error("output byte size overflowed usize")]
    OutputBytesOverflow,
    /// The bytes sent to one peer overflow.
    #[error("send byte size for peer {peer} overflowed usize")]
    SendBytesOverflow {
        /// The destination rank.
        peer: usize,
    },
    /// The bytes received from one peer overflow.
    #[error("receive byte size for peer {peer} overflowed usize")]
    RecvBytesOverflow {
        /// The source rank.
        peer: usize,
    },
    /// On a singleton, the rows sent and received differ.
    #[error("singleton send and receive counts must match")]
    SingletonMismatch,
    /// The rows a rank sends itself differ from those it expects from itself.
    #[error("self send count {send} does not match self receive count {recv}")]
    SelfMismatch {
        /// `send_counts[rank]`.
        send: usize,
        /// `recv_counts[rank]`.
        recv: usize,
    },
    /// A send count does not fit in `i64`.
    #[error("send count exceeds i64")]
    SendCountOverflow,
    /// A receive count does not fit in `i64`.
    #[error("receive count exceeds i64")]
    RecvCountOverflow,
}

impl From<AllToAllVError> for Error {
    fn from(error: AllToAllVError) -> Self {
        Self::AllToAllV(error)
    }
}
