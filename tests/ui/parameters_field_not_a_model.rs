use safemlx_dist::grad::Parameters;
use safemlx_dist::nn::Mlp;

// `steps` is neither a model part nor skipped.
#[derive(Parameters)]
struct Block {
    mlp: Mlp,
    steps: usize,
}

fn main() {}
