// The server: Debian's binaries, a cluster of its own in a temporary
// directory, on a free loopback port, run as an unprivileged user;
// started, shut down, started again, and removed.

package pgtest

import (
	"context"
	"errors"
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

// Server is a PostgreSQL server Start started. Its methods are not safe
// for concurrent use.
type Server struct {
	// DSN is a URL of its database postgres, as the superuser postgres
	// (trust authentication), over TCP: set by Start, the same after a
	// restart.
	DSN string
	// Port is its port on 127.0.0.1.
	Port int

	dir  string              // the temporary directory: data, socket, log
	bin  string              // the directory of initdb and postgres
	cred *syscall.Credential // the user it runs as; nil: this process's
	cmd  *exec.Cmd           // the postmaster running, nil once shut down
}

// Start starts a cluster of its own: initdb, then postgres on a free
// port of 127.0.0.1, as the user nobody when the caller runs as root
// (PostgreSQL refuses to run as root). bin is the directory of initdb
// and postgres; empty: the newest of /usr/lib/postgresql/*/bin
// (Debian's packages). It returns once the server accepts a
// connection, or an error saying what failed; Stop removes it.
func Start(bin string) (*Server, error) {
	bin, err := findBin(bin)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "ha-postgres-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir}
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
	if err := s.Restart(); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// Restart starts the postmaster again on the cluster and port of s,
// after Shutdown (Start starts it the first time through it), and
// returns once it accepts a connection.
func (s *Server) Restart() error {
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

// findBin returns bin, or when it is empty the newest of Debian's.
func findBin(bin string) (string, error) {
	if bin != "" {
		return bin, nil
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
	return "", errors.New("no PostgreSQL found under /usr/lib/postgresql/*/bin (apt-get install postgresql), nor given")
}

// runAs returns the credential the server runs under, and hands dir to
// it: nil (this process's user) unless it runs as root, then the user
// nobody's.
func runAs(dir string) (*syscall.Credential, error) {
	if os.Getuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		return nil, fmt.Errorf("running as root, and PostgreSQL will not: no user nobody to run it as: %w", err)
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

// Shutdown shuts the postmaster down fast (SIGINT: every connection
// ended, no wait for clients), and waits for it, killing it after 10s.
// Restart starts it again.
func (s *Server) Shutdown() {
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

// Stop shuts the server down fast, and removes its directory.
func (s *Server) Stop() {
	s.Shutdown()
	_ = os.RemoveAll(s.dir)
}
