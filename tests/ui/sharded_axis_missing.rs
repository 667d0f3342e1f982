use safemlx_dist::{sharded, Sharded, ShardedArray};

#[sharded]
struct Layer {
    #[shard(Sharded)]
    up: ShardedArray<Sharded<1>>,
}

fn main() {}
