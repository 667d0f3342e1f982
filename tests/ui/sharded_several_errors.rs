use safemlx_dist::{sharded, Replicated, Sharded, ShardedArray};

// Every mistake is reported at once, on its own token.
#[sharded]
struct Layer {
    #[shard(Sharded<1>, segs = 3)]
    up: ShardedArray<Sharded<1>>,
    bias: ShardedArray<Replicated>,
}

fn main() {}
