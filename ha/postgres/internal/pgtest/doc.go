// Package pgtest starts a PostgreSQL server of its own, for the tests of
// ha/postgres and for its example: Debian's initdb and postgres (the
// newest of /usr/lib/postgresql/*/bin, or a directory given), a cluster
// in a temporary directory, on a free loopback port, run as the user
// nobody when the caller is root (PostgreSQL refuses to run as root).
package pgtest
