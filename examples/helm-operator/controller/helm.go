package controller

import (
	"context"
	"fmt"
	"time"

	"helm.sh/helm/v3/pkg/kube"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// restClientGetter gives Helm the manager's rest.Config, as operators on Helm's action package
// do (Helm's own getter reads a kubeconfig and caches discovery on disk).
type restClientGetter struct {
	cfg       *rest.Config
	namespace string
}

var _ genericclioptions.RESTClientGetter = restClientGetter{}

func newRESTClientGetter(cfg *rest.Config, namespace string) restClientGetter {
	return restClientGetter{cfg: cfg, namespace: namespace}
}

func (g restClientGetter) ToRESTConfig() (*rest.Config, error) { return rest.CopyConfig(g.cfg), nil }

func (g restClientGetter) ToDiscoveryClient() (discovery.CachedDiscoveryInterface, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(g.cfg)
	if err != nil {
		return nil, fmt.Errorf("failed to make a discovery client: %w", err)
	}
	return memory.NewMemCacheClient(dc), nil
}

func (g restClientGetter) ToRESTMapper() (meta.RESTMapper, error) {
	dc, err := g.ToDiscoveryClient()
	if err != nil {
		return nil, err
	}
	return restmapper.NewDeferredDiscoveryRESTMapper(dc), nil
}

// ToRawKubeConfigLoader serves the namespace only: Helm reads its resources' default
// namespace from it.
func (g restClientGetter) ToRawKubeConfigLoader() clientcmd.ClientConfig {
	return clientcmd.NewDefaultClientConfig(*clientcmdapi.NewConfig(),
		&clientcmd.ConfigOverrides{Context: clientcmdapi.Context{Namespace: g.namespace}})
}

// pollClient is Helm's kube client whose Wait and WaitWithJobs poll every interval instead of
// Helm's fixed 2s: the example's tests scale every time down by one factor, Helm's poll too.
// It waits as Helm's waiter does: on a context of its own (not the caller's), until the
// timeout, each resource through Helm's ReadyChecker.
type pollClient struct {
	kube.Interface
	getter   restClientGetter
	interval time.Duration
}

func newPollClient(c kube.Interface, getter restClientGetter, interval time.Duration) *pollClient {
	return &pollClient{Interface: c, getter: getter, interval: interval}
}

func (c *pollClient) Wait(resources kube.ResourceList, timeout time.Duration) error {
	return c.wait(resources, timeout, false)
}

func (c *pollClient) WaitWithJobs(resources kube.ResourceList, timeout time.Duration) error {
	return c.wait(resources, timeout, true)
}

func (c *pollClient) wait(resources kube.ResourceList, timeout time.Duration, jobs bool) error {
	cfg, _ := c.getter.ToRESTConfig()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("failed to make a clientset: %w", err)
	}
	checker := kube.NewReadyChecker(cs, func(string, ...any) {}, kube.PausedAsReady(true), kube.CheckJobs(jobs))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return wait.PollUntilContextCancel(ctx, c.interval, true, func(ctx context.Context) (bool, error) {
		for _, r := range resources {
			if ready, err := checker.IsReady(ctx, r); !ready || err != nil {
				return false, err
			}
		}
		return true, nil
	})
}
