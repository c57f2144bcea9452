package NarwhalBench::Report;
# Turning the measurements into bench/results/*.md and one SVG chart per
# scenario (gnuplot).
use strict;
use warnings;
use utf8;
use Exporter 'import';
use List::Util qw(max min sum);
use NarwhalBench::Util qw(median fmt_num capture);

our @EXPORT_OK = qw(summarise write_chart results_markdown summary_markdown headline);

# ---------- numbers ----------

# Per server: medians over the rounds of the rates and latencies, totals of
# errors and timeouts, maxima of unanswered connections and memory.
sub summarise {
    my ($rounds) = @_;
    my @ok = grep { !$_->{failed_run} } @$rounds;
    my %s = (rounds => scalar @$rounds, good_rounds => scalar @ok);
    return \%s unless @ok;
    my %keys;
    $keys{$_}++ for map { keys %$_ } @ok;
    for my $k (keys %keys) {
        my @v = grep { defined && /^-?[\d.]+(?:e[-+]?\d+)?$/i } map { $_->{$k} } @ok;
        next unless @v;
        if ($k =~ /^(errors|err_\w+|timeouts|reconnects|incomplete)$/) { $s{$k} = sum(@v) }
        elsif ($k =~ /^(unanswered|starved|rss_mb|pss_mb|procs|idle_unanswered|idle_closed_by_server|other_cpu_pct)$/) { $s{$k} = max(@v) }
        else { $s{$k} = median(@v) }
    }
    my @rps = map { $_->{rps} } grep { defined $_->{rps} } @ok;
    $s{spread_pct} = 100 * (max(@rps) - min(@rps)) / $s{rps} if @rps > 1 && $s{rps};
    $s{failed_rounds} = @$rounds - @ok;
    $s{failure} = (grep { $_->{failed_run} } @$rounds)[0]{failed_run} if $s{failed_rounds};
    $s{troubled} = ($s{errors} || $s{timeouts} || $s{unanswered} || $s{starved} || $s{failed_rounds}) ? 1 : 0;
    return \%s;
}

# The one number a scenario is judged by, and whether higher is better.
sub headline {
    my ($sc) = @_;
    return $sc->{headline} // { key => 'rps', label => 'requests/s', better => 'higher', dec => 0 };
}

# ---------- charts ----------

sub gp_str { my ($s) = @_; $s =~ s/(["\\])/\\$1/g; return qq{"$s"} }

# bars: [ { label, value, color (1 plain, 2 Narwhal, 3 nginx), text } ], best first
sub write_chart {
    my ($file, $title, $xlabel, $bars, $work) = @_;
    my $n = @$bars or return 0;
    my $top = (max(map { $_->{value} } @$bars) || 1) * 1.45;
    my $h = 110 + 34 * $n;
    my $data = join '', map {
        join(' ', gp_str($_->{label}), $_->{value}, $_->{color}, gp_str($_->{text})) . "\n"
    } @$bars;
    my $gp = <<"GP";
set terminal svg size 860,$h dynamic noenhanced font "DejaVu Sans,13" background rgb "white"
set output ${\ gp_str($file)}
set title ${\ gp_str($title)} font "DejaVu Sans,15"
set style fill solid 0.9 noborder
set linetype 1 lc rgb "#4a7ab5"
set linetype 2 lc rgb "#e0701a"
set linetype 3 lc rgb "#9a9a9a"
unset key
set border 1
set xtics nomirror out
set ytics nomirror scale 0
set grid xtics lc rgb "#e4e4e4" lt 1
set xrange [0:$top]
set yrange [$n - 0.45:-0.55]
set format x "${\ ($top < 10_000 ? '%.0f' : '%.0s%c') }"
set xlabel ${\ gp_str($xlabel)}
set lmargin 24
\$bars << EOD
${data}EOD
plot \$bars using (0):0:(0):2:(\$0-0.36):(\$0+0.36):3:ytic(1) with boxxyerror lc variable, \\
     \$bars using 2:0:4 with labels left offset char 0.6,0 font "DejaVu Sans,12"
GP
    my $script = "$work/chart.gp";
    open my $fh, '>:utf8', $script or die "$script: $!\n";
    print $fh $gp;
    close $fh;
    my $out = capture('gnuplot', $script);
    warn "gnuplot: $out\n" if $out =~ /\S/;
    return -s $file ? 1 : 0;
}

# ---------- markdown ----------

sub cell {
    my ($v, $dec) = @_;
    return '–' unless defined $v;
    return fmt_num($v, $dec);
}

sub ms_cell {
    my ($v) = @_;
    return '–' unless defined $v;
    return fmt_num($v, $v < 1 ? 3 : $v < 10 ? 2 : $v < 100 ? 1 : 0);
}

# errors, with their kinds when there are any: "9,722 (read)"
sub error_cell {
    my ($s) = @_;
    return cell($s->{errors}) unless $s->{errors};
    my %name = (err_connect => 'connect', err_read => 'read', err_write => 'write',
                err_status => 'non-2xx', err_other => 'broken');
    my @kinds = map { $name{$_} . ($s->{$_} == $s->{errors} ? '' : ' ' . fmt_num($s->{$_})) }
                grep { $s->{$_} } sort keys %name;
    return cell($s->{errors}) . (@kinds ? ' (' . join(', ', @kinds) . ')' : '');
}

sub ratio {
    my ($a, $b) = @_;
    return undef unless defined $a && defined $b && $b > 0;
    return $a / $b;
}

sub scenario_table {
    my ($run, $scr) = @_;
    my $sc = $scr->{sc};
    my $base = $scr->{summary}{starman};
    my @cols = ('server', 'req/s', '× Starman', 'p50 ms', 'p99 ms');
    push @cols, 'fast p50 ms', 'fast p99 ms', 'fast max ms', 'starved conns' if $sc->{paths};
    push @cols, 'total s' if $sc->{reqs};
    push @cols, 'idle answered', 'idle closed by server' if $sc->{idle};
    push @cols, 'errors', 'timeouts', 'unanswered', 'RSS MB', 'PSS MB', 'spread';
    my @rows;
    for my $id (@{ $scr->{order} }) {
        my $label = $run->{label}{$id};
        if (my $why = $scr->{not_started}{$id}) { push @rows, [ $label, "did not start: $why" ]; next }
        my $s = $scr->{summary}{$id} or next;
        if (!$s->{good_rounds}) { push @rows, [ $label, "no result: " . ($s->{failure} // '?') ]; next }
        my $r = ratio($s->{rps}, $base && $base->{rps});
        my @c = ($id eq 'narwhal' ? "**$label**" : $label, cell($s->{rps}),
                 defined $r ? sprintf('%.2f', $r) : '–', ms_cell($s->{p50_ms}), ms_cell($s->{p99_ms}));
        push @c, ms_cell($s->{fast_p50_ms}), ms_cell($s->{fast_p99_ms}), ms_cell($s->{fast_max_ms}),
                 cell($s->{starved}) if $sc->{paths};
        push @c, cell($s->{total_time_s}, 2) if $sc->{reqs};
        push @c, cell($s->{idle_answered}) . ' / ' . fmt_num($sc->{idle}), cell($s->{idle_closed_by_server}) if $sc->{idle};
        push @c, error_cell($s), cell($s->{timeouts}), cell($s->{unanswered}),
                 cell($s->{rss_mb}, 0), cell($s->{pss_mb}, 0),
                 defined $s->{spread_pct} ? sprintf('%.0f%%', $s->{spread_pct}) : '–';
        $c[-1] .= " ($s->{failed_rounds} failed)" if $s->{failed_rounds};
        push @rows, \@c;
    }
    my $md = '| ' . join(' | ', @cols) . " |\n|" . join('|', map { $_ eq 'server' ? '---' : '---:' } @cols) . "|\n";
    for my $r (@rows) {
        my @c = @$r;
        @c = ($c[0], $c[1], ('') x (@cols - 2)) if @c == 2;
        $md .= '| ' . join(' | ', @c) . " |\n";
    }
    return $md;
}

sub summary_table {
    my ($run, $link) = @_;
    $link //= '';
    my @ids = grep { my $id = $_; grep { $_->{summary}{$id} } @{ $run->{scenarios} } } @{ $run->{server_order} };
    my $md = '| scenario | metric | ' . join(' | ', map { $_ eq 'narwhal' ? "**$run->{label}{$_}**" : $run->{label}{$_} } @ids) . " |\n";
    $md .= '|---|---|' . join('|', map { '---:' } @ids) . "|\n";
    for my $scr (@{ $run->{scenarios} }) {
        my $h = headline($scr->{sc});
        my @c = ("[$scr->{sc}{name}]($link#$scr->{sc}{name})", $h->{label});
        for my $id (@ids) {
            my $s = $scr->{summary}{$id};
            if (!$s || !$s->{good_rounds}) { push @c, $scr->{not_started}{$id} ? 'failed' : '–'; next }
            my $v = !defined $s->{ $h->{key} } ? 'no answer'
                  : $h->{key} =~ /_ms$/ ? ms_cell($s->{ $h->{key} }) : cell($s->{ $h->{key} }, $h->{dec});
            push @c, $v . ($s->{troubled} ? ' ⚠' : '');
        }
        $md .= '| ' . join(' | ', @c) . " |\n";
    }
    return $md;
}

sub target_rows {
    my ($run) = @_;
    my %by = map { $_->{sc}{name} => $_->{summary} } @{ $run->{scenarios} };
    my $get = sub { my ($sc, $id, $k) = @_; my $s = $by{$sc} && $by{$sc}{$id}; return $s && $s->{good_rounds} ? $s->{$k} : undef };
    my @rows;
    my $vs = sub {
        my ($sc, $other, $goal, $what) = @_;
        my $r = ratio($get->($sc, 'narwhal', 'rps'), $get->($sc, $other, 'rps'));
        push @rows, [ "$sc: Narwhal req/s ÷ " . ($run->{label}{$other} // $other), "≥ $goal", defined $r ? sprintf('%.2f', $r) : 'n/a',
                      !defined $r ? 'n/a' : $r >= $goal ? 'met' : 'missed' ];
    };
    for my $sc ('hello_keepalive_16', 'hello_keepalive_256') {
        $vs->($sc, 'starman', 5);
        $vs->($sc, 'nginx_2w', 0.65);
    }
    $vs->('typical_app', 'starman', 2.5);
    $vs->('file_2_4mb', 'nginx_2w', 0.9);
    for my $sc ('hello_keepalive_1000', 'idle_keepalive_manager_1000') {
        my @v = map { $get->($sc, 'narwhal', $_) } qw(errors timeouts unanswered);
        my $ran = defined $get->($sc, 'narwhal', 'rps');
        my $bad = grep { ($_ // 0) > 0 } @v;
        my $unknown = grep { !defined } @v;
        push @rows, [ "$sc: Narwhal errors / timeouts / unanswered", '0 / 0 / 0',
                      $ran ? join(' / ', map { $_ // '?' } @v) : 'n/a',
                      !$ran ? 'n/a' : $bad ? 'missed' : $unknown ? 'n/a' : 'met' ];
    }
    return @rows;
}

sub targets_table {
    my ($run) = @_;
    my $md = "| target | goal | measured | status |\n|---|---:|---:|---|\n";
    $md .= '| ' . join(' | ', @$_) . " |\n" for target_rows($run);
    return $md;
}

sub machine_section {
    my ($run) = @_;
    my $m = $run->{machine};
    my $md = "| | |\n|---|---|\n";
    $md .= "| CPUs (nproc) | $m->{nproc} |\n| CPU model | " . ($m->{cpu} // '?') . " |\n";
    $md .= "| kernel | $m->{kernel} |\n| memory | $m->{memory} |\n| OS | " . ($m->{os} // '?') . " |\n";
    $md .= "| perl | $m->{perl} |\n| cpufreq governor | " . ($m->{governor} // 'n/a') . " |\n";
    $md .= "| net.core.somaxconn | " . ($m->{somaxconn} // '?') . " |\n| open files limit | $run->{nofile} |\n";
    $md .= "| $_ | $run->{tools}{$_} |\n" for sort keys %{ $run->{tools} };
    return $md;
}

sub servers_section {
    my ($run) = @_;
    my $md = "| server | version | command line | notes |\n|---|---|---|---|\n";
    for my $id (@{ $run->{server_order} }) {
        my $s = $run->{servers}{$id};
        $md .= "| $s->{label} | " . ($s->{version} // '?') . " | `" . ($run->{cmdline}{$id} // '(not started)')
             . "` | " . ($s->{note} // '') . " |\n";
    }
    return $md;
}

sub callgrind_section {
    my ($run) = @_;
    my $cg = $run->{callgrind} or return '';
    my $md = "## CPU cost: instructions per request\n\n";
    $md .= "hello.psgi, one worker process under `valgrind --tool=callgrind`, $cg->{requests} keep-alive requests "
         . "after a warm-up; user-space instructions (Ir) counted in the process that served them, divided by the "
         . "number of requests (kernel work is not counted). See bench/README.md.\n\n";
    $md .= "| server | instructions / request | × Narwhal | note |\n|---|---:|---:|---|\n";
    my $nw = $cg->{results}{narwhal} && $cg->{results}{narwhal}{ir_per_req};
    for my $id (@{ $cg->{order} }) {
        my $r = $cg->{results}{$id};
        my $x = ratio($r->{ir_per_req}, $nw);
        $md .= "| $r->{label} | " . cell($r->{ir_per_req}) . ' | ' . (defined $x ? sprintf('%.2f', $x) : '–')
             . ' | ' . ($r->{error} // $r->{note} // '') . " |\n";
    }
    return "$md\n";
}

# The summary and targets alone, for a document (PERFORMANCE.md) to include; links
# point into $report (a path from the repository root).
sub summary_markdown {
    my ($run, $report) = @_;
    return "Benchmarks ($run->{date}, commit $run->{commit}, $run->{machine}{nproc} CPUs, "
         . "$run->{params}{rounds} round(s)" . ($run->{quick} ? ', quick run' : '')
         . "; full report: [$report]($report), "
         . "how to read it: [bench/README.md](bench/README.md)):\n\n"
         . summary_table($run, $report) . "\n" . targets_table($run);
}

# The most CPU other processes took during any run of a scenario, in % of the machine.
sub background_load {
    my ($scr) = @_;
    return max(0, map { $_->{other_cpu_pct} // 0 } values %{ $scr->{summary} });
}

sub results_markdown {
    my ($run, $chart_name) = @_;
    my $p = $run->{params};
    my $worst_bg = max(0, map { background_load($_) } @{ $run->{scenarios} });
    my $md = "# Narwhal benchmark results: $run->{date}, commit $run->{commit}"
           . ($run->{dirty} ? ' (uncommitted changes)' : '') . "\n\n";
    $md .= ($run->{quick} ? "**Quick run** (`bench/run --quick`): short runs, numbers are indicative only. " : '')
         . "$p->{rounds} round(s) per scenario unless its section says otherwise, interleaved: "
         . "each round runs every server once, in turn, "
         . "then the next round starts. Tables show the median over the rounds "
         . "(errors and timeouts: total over all rounds; unanswered and memory: the worst round). "
         . "Load and servers share the same $run->{machine}{nproc} CPUs. "
         . "How to read this: [bench/README.md](../README.md). Wall time: "
         . sprintf('%.1f min', $run->{wall_s} / 60) . ".\n\n";
    $md .= sprintf("**Warning**: other processes used up to %.0f%% of the CPUs during some runs: "
                   . "those numbers are disturbed (see each scenario).\n\n", $worst_bg) if $worst_bg > 10;
    $md .= "## Summary\n\n" . summary_table($run)
         . "\n⚠ = errors, timeouts, unanswered connections or failed rounds: see the scenario's table.\n\n";
    $md .= "## Targets\n\nNarwhal's goals (reported, not pass/fail tests); n/a when Narwhal did not run.\n\n"
         . targets_table($run) . "\n";
    for my $scr (@{ $run->{scenarios} }) {
        my $sc = $scr->{sc};
        $md .= "## $sc->{name}\n\n$sc->{what}\n\n";
        $md .= "Client: `$scr->{client_cmd}` ($scr->{n_rounds} round(s))\n\n" if $scr->{client_cmd};
        $md .= "![$sc->{name}](" . $chart_name->($sc->{name}) . ")\n\n" if $scr->{chart};
        my $bg = background_load($scr);
        $md .= sprintf("⚠ Other processes used up to %.0f%% of the CPUs during these runs.\n\n", $bg) if $bg > 5;
        $md .= scenario_table($run, $scr) . "\n";
    }
    $md .= callgrind_section($run);
    $md .= "## Servers\n\n" . servers_section($run) . "\n";
    if (@{ $run->{skipped} }) {
        $md .= "Skipped:\n\n" . join('', map { "- $_\n" } @{ $run->{skipped} }) . "\n";
    }
    $md .= "## Machine and tools\n\n" . machine_section($run) . "\n";
    $md .= "Parameters: " . join(', ', map { "$_=$p->{$_}" } sort keys %$p) . ".\n\n";
    $md .= "Command: `$run->{argv}`\n";
    return $md;
}

1;
