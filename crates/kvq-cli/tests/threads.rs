//! `kvq --threads N` sizes the CPU pool every subcommand runs on.

use std::process::Command;

/// Runs the kvq binary with `args`; returns its exit success, stdout and stderr.
fn kvq(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvq"))
        .args(args)
        .env_remove("RAYON_NUM_THREADS")
        .output()
        .expect("the kvq binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_attention_benchmark_runs_on_the_threads_asked_for() {
    for threads in [1, 3] {
        let (ok, stdout, stderr) = kvq(&[
            "bench",
            "attention",
            "--kv",
            "q4_0",
            "--ctx",
            "256",
            "--iters",
            "1",
            "--json",
            "--threads",
            &threads.to_string(),
        ]);
        assert!(ok, "kvq failed: {stderr}");
        let records: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(records[0]["threads"], threads, "{stdout}");
    }
}

#[test]
fn zero_threads_is_an_error() {
    let (ok, _, stderr) = kvq(&["--threads", "0", "codecs"]);
    assert!(!ok);
    assert!(stderr.contains("--threads"), "{stderr}");
}
