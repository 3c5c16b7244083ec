package kube

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
)

// Where a pod finds its service account (the kubelet mounts it).
const (
	serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
	tokenRefresh      = time.Minute // projected tokens rotate; re-read the file this often
	requestTimeout    = 30 * time.Second
)

// InCluster is the configuration of a master running in a pod: the API
// server from KUBERNETES_SERVICE_HOST/PORT, the pod's service account token
// (re-read as the kubelet rotates it) and CA. An empty namespace is the
// pod's own. The other fields keep their defaults (see Config).
func InCluster(namespace, job string) (Config, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return Config{}, errors.New("kube: not in a pod (KUBERNETES_SERVICE_HOST/PORT unset)")
	}
	ca, err := os.ReadFile(serviceAccountDir + "/ca.crt")
	if err != nil {
		return Config{}, fmt.Errorf("kube: service account CA: %w", err)
	}
	tokenFile := serviceAccountDir + "/token"
	if _, err := os.Stat(tokenFile); err != nil {
		return Config{}, fmt.Errorf("kube: service account token: %w", err)
	}
	if namespace == "" {
		ns, err := os.ReadFile(serviceAccountDir + "/namespace")
		if err != nil {
			return Config{}, fmt.Errorf("kube: no namespace given and the pod's is unreadable: %w", err)
		}
		namespace = strings.TrimSpace(string(ns))
	}
	return Config{
		Host:      "https://" + net.JoinHostPort(host, port),
		TokenFile: tokenFile,
		CAData:    ca,
		Namespace: namespace,
		Job:       job,
	}, nil
}

// APIError is a response of the API server other than success: its HTTP
// status code and the Status object's reason and message.
type APIError struct {
	Code    int
	Reason  string
	Message string
	// Op is what was asked: "GET pods/job-worker-1".
	Op string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("kube: %s: %d %s: %s", e.Op, e.Code, e.Reason, e.Message)
}

func isStatus(err error, code int) bool {
	var e *APIError
	return errors.As(err, &e) && e.Code == code
}

func isNotFound(err error) bool { return isStatus(err, http.StatusNotFound) }
func isConflict(err error) bool { return isStatus(err, http.StatusConflict) }

// restClient is the few REST calls the owner makes, on net/http: JSON in and
// out, bearer token or client certificate, the API server's Status errors.
type restClient struct {
	base  *url.URL
	http  *http.Client
	token string
	file  string // token file, re-read every tokenRefresh

	mu       sync.Mutex
	fileTok  string
	fileRead time.Time
}

func newClient(cfg Config) (*restClient, error) {
	base, err := url.Parse(cfg.Host)
	if err != nil || base.Host == "" || (base.Scheme != "https" && base.Scheme != "http") {
		return nil, fmt.Errorf("kube: bad API server address %q", cfg.Host)
	}
	base.Path = strings.TrimSuffix(base.Path, "/")
	c := &restClient{base: base, token: cfg.BearerToken, file: cfg.TokenFile, http: cfg.HTTPClient}
	if c.http != nil {
		return c, nil
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12}
	if len(cfg.CAData) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(cfg.CAData) {
			return nil, errors.New("kube: CA data holds no PEM certificate")
		}
		tlsConfig.RootCAs = pool
	}
	if len(cfg.CertData) > 0 || len(cfg.KeyData) > 0 {
		cert, err := tls.X509KeyPair(cfg.CertData, cfg.KeyData)
		if err != nil {
			return nil, fmt.Errorf("kube: client certificate: %w", err)
		}
		tlsConfig.Certificates = []tls.Certificate{cert}
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = tlsConfig
	t.ForceAttemptHTTP2 = true
	// No overall timeout: watches are long requests; each call has its own
	// deadline through its context.
	c.http = &http.Client{Transport: t}
	return c, nil
}

func (c *restClient) bearer() (string, error) {
	if c.file == "" {
		return c.token, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fileTok != "" && time.Since(c.fileRead) < tokenRefresh {
		return c.fileTok, nil
	}
	b, err := os.ReadFile(c.file)
	if err != nil {
		if c.fileTok != "" {
			return c.fileTok, nil // keep the last one; the kubelet may be replacing the file
		}
		return "", fmt.Errorf("kube: token: %w", err)
	}
	c.fileTok, c.fileRead = strings.TrimSpace(string(b)), time.Now()
	return c.fileTok, nil
}

// request builds a request for path (from /api or /apis) with query.
func (c *restClient) request(ctx context.Context, method, path string, query url.Values, body any) (*http.Request, error) {
	u := *c.base
	u.Path += path
	u.RawQuery = query.Encode()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), r)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "kfelastic-master")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	tok, err := c.bearer()
	if err != nil {
		return nil, err
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	return req, nil
}

// do makes one call and decodes a 2xx JSON answer into out (when not nil);
// any other answer is an *APIError.
func (c *restClient) do(ctx context.Context, method, path string, query url.Values, body, out any) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	req, err := c.request(ctx, method, path, query, body)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("kube: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return statusError(method+" "+path, resp)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	dec := json.NewDecoder(resp.Body)
	dec.UseNumber() // unstructured objects keep their numbers exactly
	if err := dec.Decode(out); err != nil {
		return fmt.Errorf("kube: %s %s: decoding the answer: %w", method, path, err)
	}
	return nil
}

// statusError reads the API server's Status object from a failed answer.
func statusError(op string, resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var st status
	if json.Unmarshal(b, &st) != nil || st.Message == "" {
		st.Message = strings.TrimSpace(string(b))
	}
	return &APIError{Code: resp.StatusCode, Reason: st.Reason, Message: st.Message, Op: op}
}

// status is metav1.Status, the API server's error body (and a watch's ERROR
// event object).
type status struct {
	Code    int    `json:"code"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// watchEvent is one line of a watch stream.
type watchEvent struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

// watch opens a watch stream; the caller reads events with next and closes
// it. ctx ends it.
func (c *restClient) watch(ctx context.Context, path string, query url.Values) (*watchStream, error) {
	query.Set("watch", "true")
	req, err := c.request(ctx, http.MethodGet, path, query, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("kube: watch %s: %w", path, err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, statusError("WATCH "+path, resp)
	}
	return &watchStream{body: resp.Body, dec: json.NewDecoder(resp.Body)}, nil
}

type watchStream struct {
	body io.ReadCloser
	dec  *json.Decoder
}

// next is the next event; io.EOF when the server ended the stream.
func (w *watchStream) next() (watchEvent, error) {
	var ev watchEvent
	err := w.dec.Decode(&ev)
	return ev, err
}

func (w *watchStream) close() { _ = w.body.Close() }
