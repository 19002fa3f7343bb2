// testbed-draclient calls a DRA plugin's NodePrepareResources and
// NodeUnprepareResources over its unix socket with the kubelet's own generated
// client, as a kubelet does, and prints each call's latency: a driver's speed
// measured without the cost of a Python client.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
)

type result struct {
	PrepareSeconds   []float64 `json:"prepare_seconds"`
	UnprepareSeconds []float64 `json:"unprepare_seconds"`
}

func main() {
	socket := flag.String("socket", "", "the plugin's DRA socket")
	namespace := flag.String("namespace", "default", "the claim's namespace")
	name := flag.String("name", "", "the claim's name")
	uid := flag.String("uid", "", "the claim's UID")
	rounds := flag.Int("rounds", 300, "prepare/unprepare pairs to time")
	warmup := flag.Int("warmup", 10, "pairs made first and not timed")
	flag.Parse()
	if *socket == "" || *name == "" || *uid == "" {
		fmt.Fprintln(os.Stderr, "testbed-draclient: --socket, --name and --uid are required")
		os.Exit(2)
	}
	if err := run(*socket, *namespace, *name, *uid, *rounds, *warmup); err != nil {
		fmt.Fprintln(os.Stderr, "testbed-draclient:", err)
		os.Exit(1)
	}
}

func run(socket, namespace, name, uid string, rounds, warmup int) error {
	conn, err := grpc.NewClient("unix:"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	client := drapb.NewDRAPluginClient(conn)
	claims := []*drapb.Claim{{Namespace: namespace, Name: name, Uid: uid}}
	var out result
	for i := 0; i < warmup+rounds; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
		started := time.Now()
		prepared, err := client.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: claims})
		prepare := time.Since(started)
		if err == nil && prepared.Claims[uid].GetError() != "" {
			err = fmt.Errorf("prepare: %s", prepared.Claims[uid].GetError())
		}
		if err != nil {
			cancel()
			return err
		}
		started = time.Now()
		unprepared, err := client.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: claims})
		unprepare := time.Since(started)
		cancel()
		if err == nil && unprepared.Claims[uid].GetError() != "" {
			err = fmt.Errorf("unprepare: %s", unprepared.Claims[uid].GetError())
		}
		if err != nil {
			return err
		}
		if i >= warmup {
			out.PrepareSeconds = append(out.PrepareSeconds, prepare.Seconds())
			out.UnprepareSeconds = append(out.UnprepareSeconds, unprepare.Seconds())
		}
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}
