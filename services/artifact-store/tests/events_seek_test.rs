//! ReadEvents from a sequence number seeks through the log's seek index (events.idx): it
//! returns exactly the events from that number on, with the index intact, corrupted, torn or
//! deleted, and a restart brings a damaged index back in line.
#![allow(clippy::unwrap_used)]

mod common;

use cairn_artifact_store::Config;
use cairn_proto::v1::{AppendEventsRequest, EventInput};
use common::*;

const EVENTS: u64 = 2000;

async fn fill(client: &mut Client, run: &str) {
    create_project(client, "p").await;
    for batch in 0..EVENTS / 100 {
        let events = (0..100)
            .map(|i| EventInput {
                r#type: "test.step".into(),
                data_json: serde_json::json!({ "n": batch * 100 + i, "pad": "x".repeat((i % 13) as usize) })
                    .to_string(),
                ..Default::default()
            })
            .collect();
        client
            .append_events(AppendEventsRequest {
                project_id: "p".into(),
                run_id: run.into(),
                events,
                epoch: 0,
                publication_tokens: Vec::new(),
                claim: String::new(),
            })
            .await
            .unwrap();
    }
}

/// ReadEvents from each `from` (with and without a limit) returns exactly seqs from..=EVENTS.
async fn check_reads(client: &mut Client, run: &str, when: &str) {
    for from in [1, 2, 255, 256, 257, 258, 700, 1025, 1999, 2000, 2001] {
        let got = run_events_from(client, "p", run, from, 0).await;
        let seqs: Vec<u64> = got.iter().map(|e| e.seq).collect();
        let want: Vec<u64> = (from..=EVENTS).collect();
        assert_eq!(seqs, want, "{when}: from {from}");
        // The data is that of each seq (n = seq - 1).
        for e in &got {
            let data: serde_json::Value = serde_json::from_str(&e.data_json).unwrap();
            assert_eq!(data["n"].as_u64().unwrap(), e.seq - 1, "{when}");
        }
        let limited = run_events_from(client, "p", run, from, 3).await;
        let want: Vec<u64> = (from..=EVENTS).take(3).collect();
        assert_eq!(
            limited.iter().map(|e| e.seq).collect::<Vec<_>>(),
            want,
            "{when}: from {from}, limit 3"
        );
    }
}

fn records(index: &std::path::Path) -> Vec<(u64, u64)> {
    std::fs::read(index)
        .unwrap()
        .chunks_exact(16)
        .map(|r| {
            (
                u64::from_le_bytes(r[..8].try_into().unwrap()),
                u64::from_le_bytes(r[8..].try_into().unwrap()),
            )
        })
        .collect()
}

fn write_records(index: &std::path::Path, recs: &[(u64, u64)], tail: &[u8]) {
    let mut bytes = Vec::new();
    for (s, o) in recs {
        bytes.extend_from_slice(&s.to_le_bytes());
        bytes.extend_from_slice(&o.to_le_bytes());
    }
    bytes.extend_from_slice(tail);
    std::fs::write(index, bytes).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_from_n_are_exact_with_the_seek_index_sound_or_damaged() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path();
    let run_dir = data.join("projects/p/.cairn/runs/r1");
    let index = run_dir.join("events.idx");
    let log = run_dir.join("events.jsonl");
    let good;
    {
        let s = serve_with(Config::new(data)).await;
        let mut c = s.client.clone();
        fill(&mut c, "r1").await;
        good = records(&index);
        // One record per 256 events, each at the start of its line.
        assert_eq!(
            good.iter().map(|r| r.0).collect::<Vec<_>>(),
            [1, 257, 513, 769, 1025, 1281, 1537, 1793]
        );
        let text = std::fs::read(&log).unwrap();
        for (seq, offset) in &good {
            let line = &text[*offset as usize..];
            let line = &line[..line.iter().position(|b| *b == b'\n').unwrap()];
            let v: serde_json::Value = serde_json::from_slice(line).unwrap();
            assert_eq!(v["seq"].as_u64(), Some(*seq));
            assert!(*offset == 0 || text[*offset as usize - 1] == b'\n');
        }
        check_reads(&mut c, "r1", "sound index").await;

        // Corrupted while the store runs (readers read the index each time): offsets shifted
        // into the middle of lines, a record naming another line's seq, a torn record.
        let mut bad = good.clone();
        bad[2].1 += 5;
        bad[4].0 = 1100;
        bad[6] = (good[5].0, good[6].1);
        write_records(&index, &bad, &[7, 7, 7]);
        check_reads(&mut c, "r1", "corrupted index").await;
        // Garbage.
        std::fs::write(&index, vec![0xab; 200]).unwrap();
        check_reads(&mut c, "r1", "garbage index").await;
        // Deleted.
        std::fs::remove_file(&index).unwrap();
        check_reads(&mut c, "r1", "deleted index").await;
        s.stop().await;
    }
    // A restart rebuilds it on the first touch of the run; appends extend it.
    {
        let s = serve_with(Config::new(data)).await;
        let mut c = s.client.clone();
        check_reads(&mut c, "r1", "after restart").await;
        assert_eq!(records(&index), good, "rebuilt as it was");
        s.stop().await;
    }
    // An index missing its tail (a crash between the events and their record) and ending in a
    // record that points past the log is cut back and caught up.
    write_records(&index, &good[..5], &[]);
    let mut recs = good[..5].to_vec();
    recs.push((1281, std::fs::metadata(&log).unwrap().len() + 40));
    write_records(&index, &recs, &[1]);
    {
        let s = serve_with(Config::new(data)).await;
        let mut c = s.client.clone();
        check_reads(&mut c, "r1", "index behind").await;
        assert_eq!(records(&index), good);
        fill(&mut c, "r2").await;
        s.stop().await;
    }
}
