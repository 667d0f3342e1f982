//! Layout mistakes that must not compile, each with the message users see
//! (committed `.stderr` snapshots; regenerate with `TRYBUILD=overwrite`).

#[test]
fn placement_mistakes_do_not_compile() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("ui/*.rs");
    // And every accepted form of #[sharded] compiles.
    cases.pass("ui/pass/*.rs");
}
