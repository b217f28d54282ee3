use super::*;
use context_engine::store::MemoryStore;

/// The store a session's host reads through answers within a named
/// session only: `None` (every session) finds nothing.
#[test]
fn a_sessions_store_never_reads_across_sessions() {
    use context_engine::message::Message;
    let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    let mut batch = Batch::new();
    let handle = batch.archive_span(&[Message::user("secret AKIA-planted words")], 0, 1);
    store.commit("a:s", &batch).unwrap();
    let staged = Staged::new(Arc::clone(&store), None);
    assert!(staged.resolve(Some("a:s"), &handle).unwrap().is_some());
    assert!(staged.resolve(Some("b:s"), &handle).unwrap().is_none());
    assert!(staged.resolve(None, &handle).unwrap().is_none());
    assert_eq!(staged.search(Some("a:s"), "planted", 5).unwrap().len(), 1);
    assert!(staged.search(None, "planted", 5).unwrap().is_empty());
    assert!(
        store.resolve(None, &handle).unwrap().is_some(),
        "the store itself does"
    );
}

/// Feeds the client's history `raws` to `l` as the proxy does.
fn feed(l: &mut Lineage, raws: &[Box<serde_json::value::RawValue>]) {
    let refs: Vec<&serde_json::value::RawValue> = raws.iter().map(AsRef::as_ref).collect();
    let chain = super::super::lineage::chain(&refs);
    let from = match l.reconcile(&chain) {
        super::super::lineage::Reconcile::Extends { new_from }
        | super::super::lineage::Reconcile::Diverged { new_from, .. } => new_from,
    };
    for (i, raw) in refs.iter().enumerate().skip(from) {
        l.push_client(serde_json::from_str(raw.get()).unwrap(), raw, i);
    }
    l.set_chain(&chain);
    let messages = l.messages().to_vec();
    l.render(&messages);
}

fn user(text: &str) -> Box<serde_json::value::RawValue> {
    serde_json::value::RawValue::from_string(
        serde_json::json!({"role": "user", "content": text}).to_string(),
    )
    .unwrap()
}

/// Writes what changed into `segments` (as a store would): the bytes
/// written, `None` when nothing.
fn write(l: &Lineage, segments: &mut Vec<String>, mark: &mut Option<HistoryMark>) -> Option<usize> {
    let delta = history_delta(l, mark.as_ref()).unwrap()?;
    delta.write().apply(segments);
    *mark = Some(delta.mark);
    Some(delta.append.iter().map(String::len).sum())
}

fn same(a: &Lineage, b: &Lineage) {
    assert_eq!(a.to_record().unwrap(), b.to_record().unwrap());
}

#[test]
fn the_history_is_written_as_segments_of_what_changed() {
    let mut raws: Vec<_> = (0..10)
        .map(|i| user(&format!("message {i} {}", "x".repeat(200))))
        .collect();
    let mut l = Lineage::default();
    let (mut segments, mut mark) = (Vec::new(), None);
    feed(&mut l, &raws);
    let first = write(&l, &mut segments, &mut mark).expect("first write");
    assert_eq!(segments.len(), 1);
    assert!(
        write(&l, &mut segments, &mut mark).is_none(),
        "nothing changed"
    );
    // Each step appends one message: a small segment, not the lineage.
    for i in 10..40 {
        raws.push(user(&format!("message {i} {}", "x".repeat(200))));
        feed(&mut l, &raws);
        let n = write(&l, &mut segments, &mut mark).expect("step");
        assert!(n < 500, "step {i} wrote {n} bytes");
        same(&Lineage::from_segments(&segments).unwrap(), &l);
    }
    assert_eq!(segments.len(), 31);
    assert!(first > 2000);
    // A compaction replaces the middle: the segment keeps the start.
    let messages = l.messages().to_vec();
    let summary: context_engine::message::Message =
        serde_json::from_str(r#"{"role":"user","content":"[summary]"}"#).unwrap();
    l.replace(vec![messages[0].clone(), summary, messages[39].clone()]);
    write(&l, &mut segments, &mut mark).expect("compaction");
    same(&Lineage::from_segments(&segments).unwrap(), &l);
    // The client diverges: cut and rebuilt, still one segment more (or
    // a rewrite), and the stored lineage is the one in memory.
    raws.truncate(5);
    raws.push(user("a new branch"));
    feed(&mut l, &raws);
    write(&l, &mut segments, &mut mark).expect("divergence");
    same(&Lineage::from_segments(&segments).unwrap(), &l);
    // The client truncates: what is stored past the cut goes too.
    raws.push(user("one more"));
    feed(&mut l, &raws);
    write(&l, &mut segments, &mut mark).expect("step");
    raws.pop();
    feed(&mut l, &raws);
    write(&l, &mut segments, &mut mark).expect("truncation");
    same(&Lineage::from_segments(&segments).unwrap(), &l);
    // Segments never pile up past the bound: the history is rewritten.
    for i in 0..2 * MAX_SEGMENTS {
        raws.push(user(&format!("more {i}")));
        feed(&mut l, &raws);
        write(&l, &mut segments, &mut mark).expect("step");
        assert!(segments.len() <= MAX_SEGMENTS);
    }
    same(&Lineage::from_segments(&segments).unwrap(), &l);
    // A lineage written whole before segments reads as one.
    same(
        &Lineage::from_segments(&[l.to_record().unwrap()]).unwrap(),
        &l,
    );
}

/// Another instance appends a segment; a copy of the version before
/// applies only that segment and builds the stored lineage, which the
/// digest confirms; applied to a copy that was not the stored base,
/// the digest tells.
#[test]
fn a_copy_applies_what_was_appended_and_the_digest_checks_it() {
    let mut raws: Vec<_> = (0..10)
        .map(|i| user(&format!("message {i} {}", "x".repeat(50))))
        .collect();
    let mut a = Lineage::default();
    let (mut segments, mut mark) = (Vec::new(), None);
    feed(&mut a, &raws);
    write(&a, &mut segments, &mut mark).expect("first write");
    let held = segments.len();
    let held_mark = mark.clone().expect("mark");
    // The other instance reads the record, steps, and appends.
    let mut b = Lineage::from_segments(&segments).unwrap();
    raws.push(user("the next call"));
    feed(&mut b, &raws);
    write(&b, &mut segments, &mut mark).expect("step");
    let stored = mark.expect("mark").digest();
    assert_eq!(segments.len(), held + 1);
    let mut moved = a;
    moved.apply_segments(&segments[held..], held).unwrap();
    assert_eq!(
        held_mark.appended(&moved, &segments[held..]).digest(),
        stored
    );
    same(&moved, &b);
    // A copy that is not what the store held of its version.
    let mut other = Lineage::default();
    let wrong: Vec<_> = (0..10).map(|i| user(&format!("other {i}"))).collect();
    feed(&mut other, &wrong);
    other.apply_segments(&segments[held..], held).unwrap();
    assert_ne!(
        held_mark.appended(&other, &segments[held..]).digest(),
        stored
    );
}

/// A store that fails while `down`, counting the calls it gets.
#[derive(Default)]
struct Flaky {
    down: std::sync::atomic::AtomicBool,
    calls: std::sync::atomic::AtomicUsize,
}

impl Flaky {
    fn answer<T>(&self, ok: T) -> Result<T, StoreError> {
        use std::sync::atomic::Ordering;
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::Backend {
                location: "flaky".into(),
                detail: "no answer".into(),
            });
        }
        Ok(ok)
    }
}

impl SessionStore for Flaky {
    fn location(&self) -> String {
        "flaky".into()
    }
    fn commit(&self, _: &str, _: &Batch) -> Result<(), StoreError> {
        self.answer(())
    }
    fn load_state(&self, _: &str) -> Result<Option<Value>, StoreError> {
        self.answer(None)
    }
    fn resolve(&self, _: Option<&str>, _: &str) -> Result<Option<Entry>, StoreError> {
        self.answer(None)
    }
    fn search(&self, _: Option<&str>, _: &str, _: usize) -> Result<Vec<SearchHit>, StoreError> {
        self.answer(Vec::new())
    }
    fn compactions(&self, _: &str) -> Result<Vec<CompactionRecord>, StoreError> {
        self.answer(Vec::new())
    }
    fn handles(&self, _: &str) -> Result<Vec<String>, StoreError> {
        self.answer(Vec::new())
    }
    fn delete_session(&self, _: &str) -> Result<(), StoreError> {
        self.answer(())
    }
    fn version(&self, _: &str) -> Result<Option<u64>, StoreError> {
        self.answer(None)
    }
    fn try_claim(&self, _: &str, _: &str, _: &str, _: Duration) -> Result<bool, StoreError> {
        self.answer(true)
    }
}

/// A failed store is skipped at once (no call) until the probe in the
/// background finds it answering; one session's unreadable record is
/// not an outage.
#[test]
fn a_failed_store_is_skipped_until_the_probe_finds_it_back() {
    use std::sync::atomic::Ordering;
    let flaky = Arc::new(Flaky::default());
    let shared = SharedStore::new(Arc::clone(&flaky) as Arc<dyn SessionStore>);
    let ttl = Duration::from_secs(60);
    let corrupt = StoreError::Corrupt {
        location: "flaky".into(),
        detail: "state of `-:s`: not JSON".into(),
    };
    assert!(
        shared
            .observe(Instant::now(), Err::<(), _>(corrupt))
            .is_err()
    );
    assert!(shared.health.degraded().is_none() && shared.available());

    flaky.down.store(true, Ordering::SeqCst);
    assert!(!shared.claim("-:s", "summary", ttl), "the call fails");
    assert!(shared.health.degraded().is_some());
    let calls = flaky.calls.load(Ordering::SeqCst);
    for _ in 0..5 {
        assert!(!shared.claim("-:s", "summary", ttl));
    }
    assert_eq!(
        flaky.calls.load(Ordering::SeqCst),
        calls,
        "skipped without a call"
    );

    flaky.down.store(false, Ordering::SeqCst);
    let t = Instant::now();
    while !shared.available() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(shared.health.degraded().is_none(), "the probe closed it");
    assert!(shared.claim("-:s", "summary", ttl));
}

#[test]
fn one_instance_computes_a_background_job() {
    let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    let a = SharedStore::new(Arc::clone(&store));
    let mut b = SharedStore::new(store);
    b.owner.push_str("-b");
    let ttl = Duration::from_secs(60);
    assert!(a.claim("-:s", "summary", ttl));
    assert!(!b.claim("-:s", "summary", ttl), "a holds it");
    assert!(a.claim("-:s", "summary", ttl), "renewed by its owner");
    a.release("-:s", "summary");
    assert!(b.claim("-:s", "summary", ttl), "free again");
    assert!(a.health.degraded().is_none());
}
