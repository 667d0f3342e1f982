use safemlx_dist::{sharded, Sharded, ShardedArray};

#[sharded]
struct Layer {
    #[shard(Sharded<1>)]
    #[shard(Sharded<0>)]
    up: ShardedArray<Sharded<1>>,
}

fn main() {}
