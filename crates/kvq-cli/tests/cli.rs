//! The kvq binary's options and its errors on arguments it cannot honour.

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

#[test]
fn impossible_sizes_are_errors_not_wrapped_numbers() {
    let shape = [
        "--layers",
        "32",
        "--kv-heads",
        "8",
        "--head-dim",
        "128",
        "--kv",
        "q4_0",
    ];
    for (extra, message) in [
        (["--ctx", "18446744073709551615"], "overflows"),
        (["--batch", "0"], "at least 1"),
        (["--ctx", "0"], "at least 1"),
    ] {
        let args: Vec<&str> = ["memory"]
            .iter()
            .chain(&shape)
            .chain(&extra)
            .copied()
            .collect();
        let (ok, stdout, stderr) = kvq(&args);
        assert!(!ok && stdout.is_empty(), "{args:?}: {stdout}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
    let (ok, _, stderr) = kvq(&["bench", "attention", "--ctx", "0", "--iters", "1"]);
    assert!(!ok && stderr.contains("--ctx"), "{stderr}");
}
