// The PostgreSQL server the tests run against: Debian's binaries, a
// cluster of its own in a temporary directory, on a free loopback port,
// run as an unprivileged user.

package postgres

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgBin is the directory of initdb and postgres; empty: the newest of
// /usr/lib/postgresql/*/bin (Debian's packages).
var pgBin = flag.String("pg.bin", "", "directory of PostgreSQL's initdb and postgres (default: the newest /usr/lib/postgresql/*/bin)")

// pgServer is a PostgreSQL server a test run started.
type pgServer struct {
	dir  string              // the temporary directory: data, socket, log
	bin  string              // the directory of initdb and postgres
	cred *syscall.Credential // the user it runs as; nil: this process's
	cmd  *exec.Cmd           // the postmaster running, nil once shut down
	DSN  string              // a URL of its database postgres, as user postgres, over TCP
	Port int
}

// startPostgres starts a cluster of its own: initdb, then postgres on a
// free port of 127.0.0.1, as the user nobody when the tests run as root
// (PostgreSQL refuses to run as root). It returns once the server
// accepts a connection, or an error saying what failed.
func startPostgres() (*pgServer, error) {
	bin, err := findPgBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "ha-postgres-")
	if err != nil {
		return nil, err
	}
	s := &pgServer{dir: dir}
	cred, err := runAs(dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync", "--locale=C")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	if s.Port, err = freePort(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	s.bin, s.cred = bin, cred
	if err := s.start(); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// start starts the postmaster on the cluster and port of s, and returns
// once it accepts a connection.
func (s *pgServer) start() error {
	logf, err := os.OpenFile(filepath.Join(s.dir, "postgres.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	// fsync off: a test server loses nothing it needs in a crash of the
	// machine; synchronous_commit stays on, as the store assumes.
	s.cmd = exec.Command(filepath.Join(s.bin, "postgres"), "-D", filepath.Join(s.dir, "data"), "-p", strconv.Itoa(s.Port), "-k", s.dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "max_connections=400", "-c", "fsync=off", "-c", "shared_buffers=32MB")
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Setpgid: true}
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("starting postgres: %w", err)
	}
	s.DSN = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.Port)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := pgx.Connect(ctx, s.DSN)
		if err == nil {
			_ = c.Close(ctx)
			cancel()
			return nil
		}
		cancel()
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(s.dir, "postgres.log"))
			return fmt.Errorf("postgres did not accept a connection in 30s: %v\n%s", err, log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// findPgBin returns -pg.bin, or the newest of Debian's.
func findPgBin() (string, error) {
	if *pgBin != "" {
		return *pgBin, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return va - vb
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i], nil
		}
	}
	return "", errors.New("no PostgreSQL found under /usr/lib/postgresql/*/bin (apt-get install postgresql), nor given by -pg.bin")
}

// runAs returns the credential the server runs under, and hands dir to
// it: nil (this process's user) unless the tests run as root, then the
// user nobody's.
func runAs(dir string) (*syscall.Credential, error) {
	if os.Getuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		return nil, fmt.Errorf("the tests run as root and PostgreSQL will not: no user nobody to run it as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// freePort returns a TCP port of 127.0.0.1 free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// shutdown shuts the postmaster down fast (SIGINT: every connection
// ended, no wait for clients), and waits for it, killing it after 10s.
func (s *pgServer) shutdown() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	done := make(chan struct{})
	go func() { // joined below, by <-done
		_ = s.cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
	s.cmd = nil
}

// stop shuts the server down fast, and removes its directory.
func (s *pgServer) stop() {
	s.shutdown()
	_ = os.RemoveAll(s.dir)
}
