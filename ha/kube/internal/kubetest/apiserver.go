// The kube-apiserver: a pinned Kubernetes release built from the Go
// module proxy by ha/internal/gobuild, cached per release, and started
// with RBAC and static tokens for an administrator and for the replicas.

package kubetest

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/bgctl/controller/ha/internal/gobuild"
)

// CurrentKube is the Kubernetes release whose kube-apiserver runs by
// default (pinned in ha/internal/gobuild, which builds it).
const CurrentKube = gobuild.CurrentKube

// CheckRelease tells why release is no Kubernetes release the build can
// make, or returns nil.
func CheckRelease(release string) error { return gobuild.CheckKubeRelease(release) }

// APIServerBinary returns the cached kube-apiserver of release
// ("v1.36.3"), built first if need be: minutes the first time.
func APIServerBinary(release string) (string, error) { return gobuild.KubeAPIServer(release) }

// APIServer is a running kube-apiserver. Its fields are set by
// StartAPIServer, StartPeer or Restart and never change.
type APIServer struct {
	URL          string // https://127.0.0.1:<port>
	CAFile       string // the CA of its self-signed serving certificate
	AdminToken   string // user admin, group system:masters
	ReplicaToken string // the ServiceAccount of deploy/rbac.yaml
	Proc         *Process

	bin, release string   // the binary and the release it reports
	dir          string   // its own files: the log, and the data of a first server
	args         []string // its flags, for Restart
	restarts     int      // how many Restarts made it from the first start
	// shared are the flags every server of its cluster takes alike: the
	// tokens it accepts, the key it checks ServiceAccount tokens with,
	// and its serving certificate, for StartPeer.
	shared []string
}

// The replicas' identity: the username and groups Kubernetes gives a pod
// that runs as the ServiceAccount my-service of namespace my-service, the
// subject deploy/rbac.yaml binds. A static token stands in for the
// ServiceAccount's own token, which needs a controller-manager to issue.
const (
	ReplicaNamespace = "my-service"
	ReplicaUser      = "system:serviceaccount:" + ReplicaNamespace + ":my-service"
	replicaGroups    = "system:serviceaccounts,system:serviceaccounts:" + ReplicaNamespace
)

// StartAPIServer starts the kube-apiserver at bin against the etcd at
// etcdURL, with its files in dir and the flags extra added to its own,
// and returns once it is ready and reports release.
func StartAPIServer(bin, release, etcdURL, dir string, extra ...string) (*APIServer, error) {
	saKey, err := writeRSAKey(filepath.Join(dir, "service-account.key"))
	if err != nil {
		return nil, err
	}
	s := &APIServer{AdminToken: rand.Text(), ReplicaToken: rand.Text(), bin: bin, release: release, dir: dir}
	tokens := filepath.Join(dir, "tokens.csv") // token,user,uid,"group,..."
	csv := fmt.Sprintf("%s,admin,admin,\"system:masters\"\n%s,%s,replica,\"%s\"\n", s.AdminToken, s.ReplicaToken, ReplicaUser, replicaGroups)
	if err := os.WriteFile(tokens, []byte(csv), 0o600); err != nil {
		return nil, err
	}
	certDir := filepath.Join(dir, "certs")
	s.CAFile = filepath.Join(certDir, "apiserver.crt") // the serving certificate and its CA, written at start
	keys := []string{
		"--service-account-key-file", saKey,
		"--service-account-signing-key-file", saKey,
		"--token-auth-file", tokens,
	}
	// A peer serves the certificate the first start wrote into
	// --cert-dir; a restart finds it there and writes no other.
	s.shared = slices.Concat(keys, []string{"--tls-cert-file", s.CAFile, "--tls-private-key-file", filepath.Join(certDir, "apiserver.key")})
	if err := s.start(etcdURL, slices.Concat(keys, []string{"--cert-dir", certDir}), extra); err != nil {
		return nil, err
	}
	return s, nil
}

// StartPeer starts another kube-apiserver of s's control plane, against
// the etcd at etcdURL (s's, for a control plane), with its log in dir and
// the flags extra added to its own: it accepts s's tokens, checks
// ServiceAccount tokens with s's key and serves s's certificate, so that
// a client of s may be moved to it, as the API servers behind one load
// balancer serve one cluster.
func (s *APIServer) StartPeer(etcdURL, dir string, extra ...string) (*APIServer, error) {
	p := &APIServer{CAFile: s.CAFile, AdminToken: s.AdminToken, ReplicaToken: s.ReplicaToken,
		bin: s.bin, release: s.release, dir: dir, shared: s.shared}
	if err := p.start(etcdURL, s.shared, extra); err != nil {
		return nil, err
	}
	return p, nil
}

// Restart starts s again once its process has ended (Proc.Stop kills
// it): on the same port, with the same flags and certificate, as a
// server a supervisor restarts. The log goes to a file of the restart's
// own in s's directory. It returns the restarted server.
func (s *APIServer) Restart() (*APIServer, error) {
	r := *s
	r.Proc, r.restarts = nil, s.restarts+1
	if err := r.launch(); err != nil {
		return nil, err
	}
	return &r, nil
}

// start picks s's port and starts it against etcdURL, with the flags
// own (its certificate's and tokens') and extra.
func (s *APIServer) start(etcdURL string, own, extra []string) error {
	port, err := FreePort()
	if err != nil {
		return err
	}
	s.URL = fmt.Sprintf("https://127.0.0.1:%d", port)
	s.args = slices.Concat([]string{
		"--etcd-servers", etcdURL,
		"--secure-port", fmt.Sprint(port),
		"--bind-address", "127.0.0.1",
		"--advertise-address", "127.0.0.1",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--authorization-mode", "Node,RBAC",
		"--service-cluster-ip-range", "10.0.0.0/24"}, own, extra)
	return s.launch()
}

// launch runs s.bin with s.args and returns once the server is ready and
// reports s.release.
func (s *APIServer) launch() error {
	logName := "kube-apiserver.log"
	if s.restarts > 0 {
		logName = fmt.Sprintf("kube-apiserver.restart-%d.log", s.restarts)
	}
	var err error
	s.Proc, err = startProcess(s.bin, filepath.Join(s.dir, logName), "", s.args...)
	if err != nil {
		return err
	}
	var version struct{ GitVersion string }
	var hc *http.Client
	err = s.Proc.waitFor(60*time.Second, func() error {
		if hc == nil {
			// The certificate is there once the server listens.
			c, err := s.httpClient()
			if err != nil {
				return err
			}
			hc = c
		}
		if err := s.getAsAdmin(hc, "/readyz", nil); err != nil {
			return err
		}
		return s.getAsAdmin(hc, "/version", &version)
	})
	if hc != nil {
		hc.CloseIdleConnections()
	}
	if err == nil && version.GitVersion != s.release {
		err = fmt.Errorf("%s serves Kubernetes %s, not %s", s.bin, version.GitVersion, s.release)
	}
	if err != nil {
		s.Proc.Stop()
		return fmt.Errorf("kube-apiserver: %w", err)
	}
	return nil
}

// httpClient returns a client that trusts the server's CA alone.
func (s *APIServer) httpClient() (*http.Client, error) {
	ca, err := os.ReadFile(s.CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("no certificate in %s", s.CAFile)
	}
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}, nil
}

// getAsAdmin GETs path with the administrator's token and decodes the
// JSON answer into v when it is not nil.
func (s *APIServer) getAsAdmin(hc *http.Client, path string, v any) error {
	req, err := http.NewRequest(http.MethodGet, s.URL+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+s.AdminToken)
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	if v == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// writeRSAKey writes a new RSA key to path in PEM, for the server to sign
// and check ServiceAccount tokens with, and returns path.
func writeRSAKey(path string) (string, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", err
	}
	block := &pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}
	return path, os.WriteFile(path, pem.EncodeToMemory(block), 0o600)
}
