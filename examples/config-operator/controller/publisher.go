package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// HTTPPublisher publishes to a config store over HTTP: a PUT of the data, as JSON, to
// URL/<namespace>/<name>, which answers 2xx once it stored it.
type HTTPPublisher struct {
	URL string
	// Client sends the requests. nil: http.DefaultClient.
	Client *http.Client
}

var _ Publisher = (*HTTPPublisher)(nil)

// Publish sends the PUT and waits for the answer, or for ctx to end.
func (p *HTTPPublisher) Publish(ctx context.Context, key client.ObjectKey, data map[string]string) error {
	body, err := json.Marshal(data)
	if err != nil {
		return fmt.Errorf("failed to encode data: %w", err)
	}
	u, err := url.JoinPath(p.URL, key.Namespace, key.Name)
	if err != nil {
		return fmt.Errorf("failed to build the URL: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("failed to build the request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	c := p.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("failed to publish %s: %w", key, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("failed to publish %s: the config store answered %s", key, resp.Status)
	}
	return nil
}
