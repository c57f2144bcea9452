package NarwhalBench::Load;
# Running the load generators (wrk, and our own kaclient) against one server
# instance, sampling the server while they run, and parsing what they print.
use strict;
use warnings;
use Exporter 'import';
use POSIX ();
use Time::HiRes qw(time sleep);
use NarwhalBench::Util qw(session_memory session_cpu unaccepted_conns machine_busy own_cpu);

our @EXPORT_OK = qw(run_load settle kill_client wrk_cmd kaclient_cmd);

our $CLIENT_PID;            # the load generator running now, for cleanup
our $NCPU = do { my ($n) = NarwhalBench::Util::capture('nproc') =~ /(\d+)/; $n || 1 };

sub kill_client {
    return unless $CLIENT_PID;
    kill 'TERM', $CLIENT_PID;
    waitpid($CLIENT_PID, 0);
    undef $CLIENT_PID;
}

sub wrk_cmd {
    my ($port, $path, $sc, $p) = @_;
    my $threads = $sc->{conns} < 2 ? 1 : 2;
    return [ 'wrk', '-t', $threads, '-c', $sc->{conns}, '-d', "$p->{duration}s",
             '--timeout', "$p->{timeout}s", '--latency',
             (map { ('-H', $_) } @{ $sc->{headers} || [] }),
             "http://127.0.0.1:$port$path" ];
}

sub kaclient_cmd {
    my ($bin, $port, $sc, $p) = @_;
    my @cmd = ($bin, '-p', $port, '-c', $sc->{conns}, '--timeout', $p->{timeout}, '--drain', $p->{drain});
    if ($sc->{reqs}) { push @cmd, '-n', $p->{ka_reqs}, '--max-time', $p->{ka_max_time} }
    else            { push @cmd, '-d', $p->{duration} }
    push @cmd, '--paths', $sc->{paths} if $sc->{paths};
    push @cmd, '--idle', $sc->{idle}, '--idle-wait', $p->{idle_wait} if $sc->{idle};
    return \@cmd;
}

# Run the client, sampling server memory (max) and, for wrk runs, which
# connections sit unaccepted in the listen queue at 40%, 65% and 90% of the
# run: one unaccepted at all of them was never served ("unanswered"; wrk
# itself cannot tell). Three samples keep the sampler's own CPU use ~1%.
# Returns (output, samples).
sub run_sampled {
    my ($cmd, $inst, $expect_s, $want_queue) = @_;
    my $out_file = "$inst->{log}.client";
    my @cpu0 = (machine_busy(), own_cpu(), session_cpu($inst->{pid}), time);
    my $pid = fork // die "fork: $!\n";
    if (!$pid) {
        open STDOUT, '>', $out_file or POSIX::_exit(126);
        open STDERR, '>&', \*STDOUT;
        exec { $cmd->[0] } @$cmd or POSIX::_exit(127);
    }
    $CLIENT_PID = $pid;
    my $t0 = time;
    my %smp = (rss_mb => 0, pss_mb => 0, procs => 0);
    my $next_mem = $t0 + $expect_s / 2;
    my @q_at = $want_queue ? map { $t0 + $_ * $expect_s } 0.4, 0.65, 0.9 : ();
    my ($starved, $q_samples) = (undef, 0);
    while (waitpid($pid, POSIX::WNOHANG()) == 0) {
        sleep 0.05;
        my $t = time;
        if ($t >= $next_mem) {
            max_memory(\%smp, $inst);
            $next_mem = $t + 1;
        }
        if (@q_at && $t >= $q_at[0]) {
            shift @q_at;
            my $q = unaccepted_conns($inst->{port});
            $starved = $starved ? { map { $_ => 1 } grep { $q->{$_} } keys %$starved } : $q;
            $q_samples++;
        }
    }
    my $status = $?;
    undef $CLIENT_PID;
    $smp{other_cpu_pct} = other_cpu(\@cpu0, $inst);
    max_memory(\%smp, $inst);
    # a short run may end before the last sample: two still make a verdict
    $smp{starved} = scalar keys %$starved if $q_samples >= 2;
    open my $fh, '<', $out_file or die "$out_file: $!\n";
    local $/;
    my $out = <$fh> // '';
    $smp{client_status} = $status >> 8;
    return ($out, \%smp);
}

# Share of the machine's CPUs that processes other than the server, the load
# client and this harness used during the run: other work disturbing the
# measurement (another build or test suite, say).
sub other_cpu {
    my ($before, $inst) = @_;
    my ($busy0, $own0, $kids0, $server0, $t0) = @$before;
    my ($own1, $kids1) = own_cpu();
    my $other = (machine_busy() - $busy0) - ($own1 - $own0) - ($kids1 - $kids0)
              - (session_cpu($inst->{pid}) - $server0);
    my $capacity = (time - $t0) * $NCPU;
    return $capacity > 0 && $other > 0 ? 100 * $other / $capacity : 0;
}

sub max_memory {
    my ($smp, $inst) = @_;
    my $m = session_memory($inst->{pid});
    for my $k (qw(rss_mb pss_mb procs)) {
        $smp->{$k} = $m->{$k} if $m->{$k} > $smp->{$k};
    }
}

sub to_ms {
    my ($v, $unit) = @_;
    my %mult = (us => 0.001, ms => 1, s => 1000, m => 60000, h => 3600000);
    return $v * ($mult{$unit} // 1);
}

sub parse_wrk {
    my ($out) = @_;
    my %r;
    ($r{rps}) = $out =~ /^Requests\/sec:\s*([\d.]+)/m;
    ($r{requests}) = $out =~ /^\s*(\d+) requests in/m;
    for my $pct (50, 90, 99) {
        $r{"p${pct}_ms"} = to_ms($1, $2) if $out =~ /^\s*$pct%\s+([\d.]+)(us|ms|s|m|h)\b/m;
    }
    my ($c, $rd, $w, $t) = $out =~ /Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/;
    my ($non2xx) = $out =~ /Non-2xx or 3xx responses: (\d+)/;
    @r{qw(err_connect err_read err_write err_status)} = map { $_ // 0 } $c, $rd, $w, $non2xx;
    $r{errors} = $r{err_connect} + $r{err_read} + $r{err_write} + $r{err_status};
    $r{timeouts} = $t // 0;
    $r{failed_run} = 'wrk printed no result' unless defined $r{rps};
    return \%r;
}

sub parse_kaclient {
    my ($out, $sc) = @_;
    my %kv = $out =~ /^([\w.\/]+)=(\S+)$/mg;
    my %r = (kv => \%kv);
    return { failed_run => "kaclient printed no result: " . substr($out, 0, 200) }
        unless defined $kv{rps};
    $r{rps} = $kv{rps};
    # no successful request: no latency to speak of (not a latency of 0)
    $r{$_} = $kv{lat_count} ? $kv{"lat_$_"} : undef for qw(p50_ms p90_ms p99_ms max_ms);
    $r{errors} = $kv{failed};
    $r{timeouts} = $kv{timeouts};
    $r{unanswered} = $kv{unanswered_conns};
    $r{total_time_s} = $kv{total_time_s};
    $r{reconnects} = $kv{reconnects};
    $r{starved} = $kv{starved_conns};
    $r{incomplete} = $kv{incomplete};
    $r{err_connect} = $kv{connect_errors};
    $r{err_status} = $kv{bad_status};
    $r{err_other} = $kv{failed} - $kv{connect_errors} - $kv{bad_status};
    if ($sc->{paths}) {
        for my $path (map { (split /:/)[0] } split /,/, $sc->{paths}) {
            my $tag = $path =~ s{^/}{}r;
            my $n = $kv{"path.$path.count"};
            $r{"${tag}_$_"} = $n ? $kv{"path.$path.$_"} : undef for qw(p50_ms p99_ms max_ms);
            $r{"${tag}_count"} = $n;
        }
    }
    if ($sc->{idle}) {
        $r{$_} = $kv{$_} for grep { /^idle_/ } keys %kv;
    }
    return \%r;
}

# One measured run of scenario $sc against server instance $inst.
sub run_load {
    my ($inst, $sc, $p, $kaclient) = @_;
    my $path = $inst->{server}{kind} && $inst->{server}{kind} eq 'nginx'
        ? $sc->{nginx_path} : $sc->{path};
    my $is_wrk = $sc->{tool} eq 'wrk';
    my $cmd = $is_wrk ? wrk_cmd($inst->{port}, $path, $sc, $p)
                      : kaclient_cmd($kaclient, $inst->{port}, $sc, $p);
    my $expect = $is_wrk ? $p->{duration}
               : $sc->{idle} ? $p->{idle_wait} + $p->{duration}
               : $sc->{reqs} ? 2 : $p->{duration};
    my ($out, $smp) = run_sampled($cmd, $inst, $expect, $is_wrk);
    my $r = $is_wrk ? parse_wrk($out) : parse_kaclient($out, $sc);
    $r->{unanswered} = $smp->{starved} if $is_wrk;
    $r->{$_} = $smp->{$_} for qw(rss_mb pss_mb procs other_cpu_pct);
    $r->{client_cmd} = join ' ', map { /[\s&?'"]/ ? "'$_'" : $_ } @$cmd;
    return $r;
}

# Wait until a server has stopped burning CPU after a run (draining queued
# connections, closing sockets) so it does not steal from the next one.
sub settle {
    my ($inst, $max_s) = @_;
    return unless $inst->{pid};
    my $deadline = time + $max_s;
    my $prev = session_cpu($inst->{pid});
    while (time < $deadline) {
        sleep 0.25;
        my $cpu = session_cpu($inst->{pid});
        last if $cpu - $prev < 0.02;
        $prev = $cpu;
    }
}

1;
