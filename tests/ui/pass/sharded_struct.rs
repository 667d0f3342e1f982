// A layer struct: every form of #[shard] the grammar accepts.
use safemlx_dist::typed::{Axis, Tp};
use safemlx_dist::{sharded, Mesh, QuantizedArray, Replicated, Sharded, ShardedArray};

#[sharded]
struct Attention {
    #[shard(Sharded<1>, segments = 3)]
    qkv: ShardedArray<Sharded<1>>,
    #[shard(Sharded<0>)]
    out: ShardedArray<Sharded<0>>,
    #[shard(Replicated)]
    norm: ShardedArray<Replicated>,
}

#[sharded]
struct Static<const N: usize> {
    #[shard(Sharded<1>, dims = [8, 16])]
    up: ShardedArray<Sharded<1>, Mesh<N>>,
}

#[sharded]
struct OnFour {
    #[shard(Sharded<0>, dims = [16, 8])]
    down: ShardedArray<Sharded<0>, Mesh<4>>,
}

#[sharded]
struct QuantizedMlp {
    #[shard(Sharded<0>, dims = [256, 64])]
    up: QuantizedArray<Sharded<0>>,
    #[shard(Sharded<1>)]
    down: QuantizedArray<Sharded<1>>,
    #[shard(Replicated)]
    table: QuantizedArray<Replicated>,
}

// Over a named mesh axis: the same checks as over a `Mesh<N>`.
#[sharded]
struct OverTp {
    #[shard(Sharded<1>, dims = [8, 16])]
    up: ShardedArray<Sharded<1>, Axis<Tp, 4>>,
    #[shard(Replicated)]
    norm: ShardedArray<Replicated, Axis<Tp, 4>>,
}

#[sharded]
struct OverAnyTp<const N: usize> {
    #[shard(Sharded<0>, dims = [16, 8])]
    down: ShardedArray<Sharded<0>, Axis<Tp, N>>,
}

fn main() {
    let _ = (Attention::from_full, Attention::gather_full, Attention::layout);
    let _ = (Static::<2>::from_full, OnFour::from_full);
    let _ = (QuantizedMlp::load_fields, QuantizedMlp::gather_full);
    let _ = (OverTp::from_full, OverAnyTp::<2>::from_full);
}
