use safemlx_dist::{sharded, Replicated, Sharded, ShardedArray};

#[sharded]
struct Layer {
    #[shard(Sharded<1>)]
    up: ShardedArray<Sharded<1>>,
    bias: ShardedArray<Replicated>,
}

fn main() {}
