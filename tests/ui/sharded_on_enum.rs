use safemlx_dist::sharded;

#[sharded]
enum Layer {
    Dense,
}

fn main() {}
