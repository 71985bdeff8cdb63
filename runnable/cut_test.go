package runnable

import (
	"context"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// TestMegabyteAdmissionNames: an AdmissionReview naming a megabyte object (a forged review,
// or a generateName that a mutating webhook sees before validation) whose handler panics
// with a megabyte value gives a "Webhook handler panicked" line of bounded size.
func TestMegabyteAdmissionNames(t *testing.T) {
	huge := strings.Repeat("n", 1<<20)
	boom := admission.HandlerFunc(func(context.Context, admission.Request) admission.Response { panic(huge) })
	for _, tc := range []struct{ name, review string }{
		{"name", string(admissionReview(t, "ns", huge, `{}`))},
		{"generateName", string(admissionReview(t, "ns", "", `{"metadata":{"generateName":"`+huge+`"}}`))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &lines{}
			_, ws := connectedWebhookServer(logs)
			ws.Register("/p", (&admission.Webhook{Handler: boom}).WithRecoverPanic(false))
			post(ws.WebhookMux(), "/p", strings.NewReader(tc.review))
			l := logs.line("Webhook handler panicked")
			// The line holds the stack too: bounded by the runtime, not by the request.
			if l == "" || len(l) > 16<<10 || !strings.Contains(l, "...(1048") {
				t.Fatalf("panic line of %d bytes: %.300q...; want one of at most 16 KiB, the name and value cut", len(l), l)
			}
		})
	}
}
