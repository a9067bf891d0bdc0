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
// StartAPIServer and never change.
type APIServer struct {
	URL          string // https://127.0.0.1:<port>
	CAFile       string // the CA of its self-signed serving certificate
	AdminToken   string // user admin, group system:masters
	ReplicaToken string // the ServiceAccount of deploy/rbac.yaml
	Proc         *Process
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
	s := &APIServer{AdminToken: rand.Text(), ReplicaToken: rand.Text()}
	tokens := filepath.Join(dir, "tokens.csv") // token,user,uid,"group,..."
	csv := fmt.Sprintf("%s,admin,admin,\"system:masters\"\n%s,%s,replica,\"%s\"\n", s.AdminToken, s.ReplicaToken, ReplicaUser, replicaGroups)
	if err := os.WriteFile(tokens, []byte(csv), 0o600); err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	certDir := filepath.Join(dir, "certs")
	s.URL = fmt.Sprintf("https://127.0.0.1:%d", port)
	s.CAFile = filepath.Join(certDir, "apiserver.crt") // the serving certificate and its CA, written at start
	args := append([]string{
		"--etcd-servers", etcdURL,
		"--cert-dir", certDir,
		"--secure-port", fmt.Sprint(port),
		"--bind-address", "127.0.0.1",
		"--advertise-address", "127.0.0.1",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", saKey,
		"--service-account-signing-key-file", saKey,
		"--authorization-mode", "Node,RBAC",
		"--token-auth-file", tokens,
		"--service-cluster-ip-range", "10.0.0.0/24"}, extra...)
	s.Proc, err = startProcess(bin, filepath.Join(dir, "kube-apiserver.log"), "", args...)
	if err != nil {
		return nil, err
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
	if err == nil && version.GitVersion != release {
		err = fmt.Errorf("%s serves Kubernetes %s, not %s", bin, version.GitVersion, release)
	}
	if err != nil {
		s.Proc.Stop()
		return nil, fmt.Errorf("kube-apiserver: %w", err)
	}
	return s, nil
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
