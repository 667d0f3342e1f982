use safemlx_dist::{sharded, QuantizedArray, Sharded};

#[sharded]
struct Layer {
    #[shard(Sharded<0>, segments = 3)]
    qkv: QuantizedArray<Sharded<0>>,
}

fn main() {}
