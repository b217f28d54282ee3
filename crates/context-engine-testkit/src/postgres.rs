//! A throwaway database per test on the PostgreSQL server the tests use
//! (`$CTX_TEST_POSTGRES`, default `postgres://postgres@127.0.0.1:5432/test`,
//! trust auth). No server: a skip with the reason, a failure under CI
//! (see [`crate::prereq::skip`]).

use std::sync::atomic::{AtomicU32, Ordering};

use tokio_postgres::NoTls;

use crate::prereq::skip;

/// The server's admin URL.
pub fn admin_url() -> String {
    std::env::var("CTX_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A database created for one test and dropped with it.
pub struct TestDb {
    /// Its URL.
    pub url: String,
    name: String,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Runs `f` on a runtime of its own, on a thread of its own (callers may
/// be inside an async test).
fn on_runtime<T: Send + 'static>(
    f: impl FnOnce(&tokio::runtime::Runtime) -> T + Send + 'static,
) -> T {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        f(&rt)
    })
    .join()
    .expect("database helper thread")
}

async fn admin(url: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

impl TestDb {
    /// A new empty database `ctx_test_<pid>_<n>`, or `None` (skipped) when
    /// no server answers.
    pub fn create() -> Option<TestDb> {
        let admin_url = admin_url();
        let name = format!(
            "ctx_test_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let (url, db) = (admin_url.clone(), name.clone());
        let created = on_runtime(move |rt| {
            let client = match rt.block_on(admin(&url)) {
                Ok(c) => c,
                Err(e) => return Err(e.to_string()),
            };
            rt.block_on(async {
                client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {db}"))
                    .await?;
                client.batch_execute(&format!("CREATE DATABASE {db}")).await
            })
            .unwrap_or_else(|e| panic!("cannot create database {db}: {e:?}"));
            Ok(())
        });
        if let Err(e) = created {
            skip(&format!("no PostgreSQL server at {admin_url}: {e}"));
            return None;
        }
        let base = admin_url
            .rsplit_once('/')
            .map_or(admin_url.as_str(), |(b, _)| b);
        Some(TestDb {
            url: format!("{base}/{name}"),
            name,
        })
    }

    /// Runs `sql` on this database.
    pub fn execute(&self, sql: &str) {
        let (url, sql) = (self.url.clone(), sql.to_owned());
        on_runtime(move |rt| {
            rt.block_on(async move { admin(&url).await?.batch_execute(&sql).await })
        })
        .expect("sql");
    }
}

impl TestDb {
    /// Drops the database (ending every connection to it) and creates it
    /// again, empty, under the same name.
    pub fn recreate(&self) {
        let (admin_url, name) = (admin_url(), self.name.clone());
        on_runtime(move |rt| {
            rt.block_on(async move {
                let client = admin(&admin_url).await?;
                client
                    .batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)"))
                    .await?;
                client
                    .batch_execute(&format!("CREATE DATABASE {name}"))
                    .await
            })
        })
        .expect("recreate the database");
    }

    /// Every value of every column of every table of this database, as
    /// text (`column::text`), each labelled `table.column`.
    pub fn all_text(&self) -> Vec<(String, String)> {
        let url = self.url.clone();
        on_runtime(move |rt| {
            rt.block_on(async move {
                let client = admin(&url).await?;
                let columns = client
                    .query(
                        "SELECT table_name::text, column_name::text FROM information_schema.columns \
                         WHERE table_schema = 'public' ORDER BY 1, 2",
                        &[],
                    )
                    .await?;
                let mut out = Vec::new();
                for c in columns {
                    let (table, column): (String, String) = (c.get(0), c.get(1));
                    let rows = client
                        .query(
                            &format!("SELECT \"{column}\"::text FROM \"{table}\""),
                            &[],
                        )
                        .await?;
                    for r in rows {
                        if let Some(v) = r.get::<_, Option<String>>(0) {
                            out.push((format!("{table}.{column}"), v));
                        }
                    }
                }
                Ok::<_, tokio_postgres::Error>(out)
            })
        })
        .expect("reading every column")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let admin_url = admin_url();
        let name = self.name.clone();
        let _ = on_runtime(move |rt| {
            rt.block_on(async move {
                admin(&admin_url)
                    .await?
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await
            })
        });
    }
}
