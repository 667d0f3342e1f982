use safemlx_dist::{sharded, Replicated, ShardedArray};

#[sharded]
struct Layer {
    #[shard(Replicated, segments = 3)]
    norm: ShardedArray<Replicated>,
}

fn main() {}
