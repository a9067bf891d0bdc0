-- The tables of github.com/bgctl/controller/ha/postgres, schema version 1.
-- The store runs this file itself on first use, with search_path set to
-- the schema of StoreOptions.Schema (default bgctl_ha); to manage it
-- yourself, run it the same way: CREATE SCHEMA bgctl_ha; SET search_path
-- TO bgctl_ha; then this file. It is idempotent. Every group (a Replica's
-- Options.Prefix) keeps its rows apart by the column grp.

CREATE TABLE IF NOT EXISTS schema_version (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    version  integer NOT NULL
);
INSERT INTO schema_version (version) VALUES (1) ON CONFLICT DO NOTHING;

-- One row per group: its position counter, updated inside every write
-- transaction of the group (its row lock orders them), and the highest
-- position pruned from the change log.
CREATE TABLE IF NOT EXISTS groups (
    grp    text PRIMARY KEY,
    pos    bigint NOT NULL DEFAULT 0,
    pruned bigint NOT NULL DEFAULT 0
);

-- One row per live session: valid until expires_at on the server's clock.
CREATE TABLE IF NOT EXISTS sessions (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    grp        text NOT NULL,
    member     text NOT NULL,
    ttl_us     bigint NOT NULL CHECK (ttl_us > 0),
    expires_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_expiry ON sessions (grp, expires_at);

-- One member record per replica ID of a group.
CREATE TABLE IF NOT EXISTS members (
    grp      text NOT NULL,
    member   text NOT NULL,
    session  bigint NOT NULL,
    digest   text NOT NULL,
    leaving  boolean NOT NULL,
    created  bigint NOT NULL,
    modified bigint NOT NULL,
    PRIMARY KEY (grp, member)
);
CREATE INDEX IF NOT EXISTS members_session ON members (session);

-- One holding per name held; created is its position, and its token.
CREATE TABLE IF NOT EXISTS claims (
    grp     text NOT NULL,
    name    text NOT NULL,
    session bigint NOT NULL,
    holder  text NOT NULL,
    created bigint NOT NULL,
    PRIMARY KEY (grp, name)
);
CREATE INDEX IF NOT EXISTS claims_session ON claims (session);

-- The chunks of the name sets members publish.
CREATE TABLE IF NOT EXISTS chunks (
    grp      text NOT NULL,
    member   text NOT NULL,
    digest   text NOT NULL,
    idx      integer NOT NULL,
    count    integer NOT NULL,
    session  bigint NOT NULL,
    data     bytea NOT NULL,
    modified bigint NOT NULL,
    PRIMARY KEY (grp, member, digest, idx, count)
);
CREATE INDEX IF NOT EXISTS chunks_session ON chunks (session);

-- The change log the feeds read by position; kind is ha.ChangeKind.
-- Pruned after StoreOptions.Retention by logged_at.
CREATE TABLE IF NOT EXISTS changes (
    grp       text NOT NULL,
    pos       bigint NOT NULL,
    kind      smallint NOT NULL,
    member    text NOT NULL DEFAULT '',
    name      text NOT NULL DEFAULT '',
    session   bigint NOT NULL DEFAULT 0,
    created   bigint NOT NULL DEFAULT 0,
    digest    text NOT NULL DEFAULT '',
    leaving   boolean NOT NULL DEFAULT false,
    idx       integer NOT NULL DEFAULT 0,
    count     integer NOT NULL DEFAULT 0,
    data      bytea,
    logged_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS changes_pos ON changes (grp, pos);
