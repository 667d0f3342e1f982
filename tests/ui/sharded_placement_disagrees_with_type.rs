use safemlx_dist::{sharded, Sharded, ShardedArray};

#[sharded]
struct Layer {
    #[shard(Sharded<0>)]
    up: ShardedArray<Sharded<1>>,
}

fn main() {}
