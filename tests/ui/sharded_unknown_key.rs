use safemlx_dist::{sharded, Sharded, ShardedArray};

#[sharded]
struct Layer {
    #[shard(Sharded<1>, segs = 3)]
    qkv: ShardedArray<Sharded<1>>,
}

fn main() {}
