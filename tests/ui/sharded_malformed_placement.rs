use safemlx_dist::{sharded, Sharded, ShardedArray};

#[sharded]
struct Layer {
    #[shard(Shardd<1>)]
    up: ShardedArray<Sharded<1>>,
}

fn main() {}
