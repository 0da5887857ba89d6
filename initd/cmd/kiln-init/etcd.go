package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/spf13/cobra"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/etcdmember"
	"github.com/kilnproject/kiln/initd/kube"
	"github.com/kilnproject/kiln/initd/task"
	"github.com/kilnproject/kiln/internal/exitcode"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

func newEtcdCmd(log *slog.Logger) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "etcd member|wait-voter",
		Short: "This node's etcd member after first boot (kiln-etcd-member, the API server's init container)",
		Long: `The etcd member's steps after first boot. member runs at every boot on a member of
several (kiln-etcd-member.service): it promotes a member that joined as a learner once it
caught up, and says when the member votes. wait-voter is the stacked control plane's
kube-apiserver init container: the API server starts once its own member votes.`,
		Example: `  kiln-init etcd member
  kiln-init etcd wait-voter --endpoint https://127.0.0.1:2379`,
		Args: cobra.ArbitraryArgs,
		RunE: needVerb,
	}
	cmd.AddCommand(newEtcdMemberCmd(log), newEtcdWaitVoterCmd())
	return cmd
}

func newEtcdMemberCmd(log *slog.Logger) *cobra.Command {
	var root string
	var wait, interval time.Duration
	cmd := &cobra.Command{
		Use:   "member [--wait D]",
		Short: "Promote this learner once it caught up; say when the member votes",
		Long: `Member waits until this node's etcd member is listed as started in the cluster's
membership and, while it is a learner (it joined a running cluster at first boot), asks
for its promotion until etcd takes it (etcd refuses a learner that is behind the leader).
It prints one line when the member votes and records the stage etcd-member for
kiln-init status. A node that runs no member of several has nothing to do. It exits 3
when --wait passes first.`,
		Example: `  kiln-init etcd member
  kiln-init etcd member --wait 2h`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			n, err := config.LoadNodeIn(root)
			if err != nil {
				return err
			}
			o, ok, err := etcdmember.ForNode(root, n, log)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if !ok {
				fmt.Fprintf(w, "kiln-init: etcd member: %s runs no etcd member of several; nothing to do\n", nodeimage.NodeConfigPath)
				return nil
			}
			var pr etcdmember.Promotion
			promote := task.WithTimeout(task.Converge("promote", nil, func(ctx context.Context) (bool, error) {
				var err error
				pr, err = etcdmember.Promote(ctx, o, interval)
				if ctx.Err() != nil && err != nil {
					err = exitcode.Timeout(err)
				}
				return pr.Promoted, err
			}), wait)
			result := func() string {
				if pr.Promoted {
					return fmt.Sprintf("member %s voting: promoted (%d refused while it caught up)", o.Name, pr.Tries)
				}
				return fmt.Sprintf("member %s voting", o.Name)
			}
			st, err := kube.RunStage(cmd.Context(), kube.StageEtcdMember, []task.Task{promote}, kube.RunOptions{Root: root, Log: log}, result)
			if err != nil {
				fmt.Fprintln(w, nodeimage.FormatEtcdFailed(o.Name, st.Failure()))
				return err
			}
			how := "voting already"
			if pr.Promoted {
				how = fmt.Sprintf("promoted from learner; etcd refused %d times while it caught up", pr.Tries)
			}
			fmt.Fprintln(w, nodeimage.FormatEtcdVoting(o.Name, st.Duration().Round(time.Second), how))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&root, "root", "/", "root of the node's filesystem")
	f.DurationVar(&wait, "wait", 2*time.Hour, "give up after this long")
	f.DurationVar(&interval, "interval", 2*time.Second, "pause between two promotion requests")
	return cmd
}

func newEtcdWaitVoterCmd() *cobra.Command {
	var endpoint, root string
	var timeout, interval time.Duration
	cmd := &cobra.Command{
		Use:   "wait-voter [--endpoint URL] [--timeout D]",
		Short: "Wait until the etcd member at an endpoint votes (the API server's init container)",
		Long: `Wait-voter asks the etcd member at --endpoint for its status, with the node's etcd
client certificate (apiserver-etcd-client, else etcd/healthcheck-client, under --root),
until it answers with a leader and is not a learner. A stacked control plane's
kube-apiserver runs it as its init container: the API server of a member that joined as a
learner starts only once that member is promoted, instead of failing against a learner.
It exits 0 then, 3 when --timeout passes first.`,
		Example: `  kiln-init etcd wait-voter
  kiln-init etcd wait-voter --endpoint https://etcd-b.internal.prod.example.com:2379 --timeout 30m`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tc, err := etcdmember.ClientTLS(root)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			start := time.Now()
			if err := etcdmember.WaitVoter(ctx, endpoint, tc, interval); err != nil {
				return exitcode.Timeout(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "kiln-init: etcd member at %s votes (waited %s)\n", endpoint, time.Since(start).Round(time.Second))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&endpoint, "endpoint", "https://127.0.0.1:2379", "client URL of the member")
	f.StringVar(&root, "root", "/", "root under which the etcd client certificate and CA are")
	f.DurationVar(&timeout, "timeout", 0, "give up after this long (0: wait until stopped)")
	f.DurationVar(&interval, "interval", 2*time.Second, "pause between two status requests")
	return cmd
}
