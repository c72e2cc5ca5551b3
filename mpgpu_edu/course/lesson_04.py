"""Lesson 04: pipeline."""

from __future__ import annotations

from mpgpu_edu.course._types import CAPSTONE, WARM_UP, Lesson, Prediction, ex

EXERCISES = (
    ex('4.1', 'balanced_boundaries', 'Pipeline: balanced layer partition', 4,
       ('Trying every split is exponential. Solve it for fewer layers and fewer stages first: '
        'the best split of the first j layers into k stages ends with some last stage, and '
        'what comes before it is itself a best split of fewer layers into k - 1 stages.',
        'Dynamic programming over (k stages, first j layers): best[k][j] = min over i of '
        'max(best[k-1][i], cost of layers i..j-1); prefix sums give a stage\'s cost in O(1). '
        'Remember the i that won each entry, then walk back from best[n_stages][n] to read '
        'the boundaries. Check the ValueError cases before anything else.',
        'best = [[inf] * (n + 1) for _ in range(P + 1)]; best[0][0] = 0\n'
        'for k in 1..P: for j in k..n: for i in k-1..j-1:\n'
        '    c = max(best[k-1][i], prefix[j] - prefix[i]); if c < best[k][j]: store c, cut=i\n'
        'then j = n; for k = P down to 2: j = cut[k][j]; collect j; reverse.'),
       WARM_UP),
    ex('4.2', 'gpipe_orders', 'Pipeline: the GPipe schedule', 4,
       ('GPipe does not interleave: a device turns to backward only after every microbatch '
        'has gone through its forward.',
        'One list per device p: the M forward Steps of stage p, then its M backward Steps. '
        'Both in microbatch order 0..M-1 (the order the check expects).',
        'for p in range(P):\n'
        '    forwards = [Step(p, m, "F") for m in range(M)]\n'
        '    orders.append(forwards + ...)   # and then?'),
       WARM_UP),
    ex('4.3', 'one_f_one_b_orders', 'Pipeline: the 1F1B schedule', 5,
       ('A device should start a backward as soon as it can, freeing that microbatch\'s '
        'activations: only the last stage can do so right after its first forward; stage p '
        'must first fill the pipeline below it.',
        'Per stage: w = min(P - 1 - p, M) warm-up forwards; then pairs (next forward, next '
        'backward) while forwards remain; then the w backwards that are left. Backwards in '
        'microbatch order. With M < P the warm-up is cut to M.',
        'fw = [Step(p, m, "F") for m in range(M)]; bw = [Step(p, m, "B") ...]\n'
        'steady = [s for pair in zip(fw[w:], bw) for s in pair]\n'
        'order = fw[:w] + steady + bw[?:]   # which backwards has zip not used yet?'),
       WARM_UP),
    ex('4.4', 'pipeline_forward_step', 'Pipeline: one forward step of the executor', 4,
       ('What crosses the wire is numbers, not a graph. For the backward to send a gradient '
        'back to the previous stage, the received tensor must become the start of this '
        'stage\'s graph.',
        'Stage 0 uses x; others recv into a fresh float32 tensor from recv_from(step, P), '
        'then make it a leaf that requires grad. Run the stage in comm.compute("forward", '
        'step.token); unless last, send the output detached from its graph (y.detach(): the '
        'same numbers, no graph) to send_to(step, P). Return the attached output.',
        'if source is not None:\n'
        '    x = torch.empty(in_shape); comm.recv(x, source, tag=message_tag(step))\n'
        '    x.requires_grad_()\n'
        'with comm.compute("forward", step.token): y = stage(x)\n'
        '# then the send (detached), unless send_to(...) is None; return y'),
       WARM_UP),
    ex('4.5', 'execute_schedule', 'Pipeline: the executor for any schedule', 18,
       ('One loop over steps_of(schedule, rank), the same code for every schedule: a forward '
        'stashes microbatch m\'s input and output until its backward, which uses them and '
        'lets go of them. Activations go forward, gradients of inputs go back; the loss is the '
        'mean over the M microbatches. Under 1F1B two neighbours send to each other at the '
        'same tick: if each send waits until the other side receives, both wait for ever; and '
        'where neighbours run their microbatches in different orders, a send that waits holds '
        'up the receive its neighbour needs first.',
        'stash = {}. F(m): get x (batch or recv into recv_shapes[m], then requires_grad_), '
        'y = stage(x) in comm.compute; the last stage turns y into loss_fn(y, t) / M; '
        'stash[m] = (x, y); send y.detach() to send_to with comm.isend and keep its Work until '
        'B(m) (a Work holds its tensor until the message is delivered). B(m): x, y = '
        'stash.pop(m); wait for F(m)\'s send and let it go (it is delivered by then: m\'s '
        'gradient comes back only after it); recv the output\'s gradient (not on the last '
        'stage); backward; isend x.grad to send_to; then del x, y, so that nothing keeps m '
        'alive. isend returns at once, so a stage goes on to the receive its neighbour is '
        'waiting on instead of blocking while that neighbour blocks on its own send. Wait for '
        'the gradient sends at the end (nothing earlier tells you they arrived). P and M are '
        'schedule.n_stages and schedule.n_microbatches. On the last stage return the sum of '
        'the M parts loss_fn(...) / M, which is their mean.',
        'for step in steps_of(schedule, comm.rank):\n'
        '    m, tag = step.microbatch, message_tag(step)\n'
        '    src, dst = recv_from(step, P), send_to(step, P)\n'
        '    if step.op == "F": ... stash[m] = (x, y); sent[m] = comm.isend(...)\n'
        '    else:\n'
        '        x, y = stash.pop(m)\n'
        '        if m in sent: sent.pop(m).wait()\n'
        '        grad = None if src is None else <recv into torch.empty_like(y)>\n'
        '        with comm.compute("backward", step.token, seconds=...):\n'
        '            torch.autograd.backward(y, grad)\n'
        '        if dst is not None: grad_sends.append(comm.isend(x.grad, dst, tag))\n'
        '        del x, y\n'
        'for work in grad_sends: work.wait()'),
       CAPSTONE),
)

PREDICTIONS = (
    Prediction(
        key="04.bubble-4x8",
        question="GPipe with 4 stages and 8 microbatches (a backward takes twice a forward): "
                 "what share of each device's step is idle?",
        choices=("about 43%, as with 4 microbatches: the bubble does not depend on M",
                 "about 27%: (P-1)/(M+P-1) = 3/11",
                 "about 38%: (P-1)/M = 3/8",
                 "about 75%: (P-1)/P, as in naive model parallelism"),
        answer=1,
        why="Each device computes M(f + b) and idles (P - 1)(f + b) while the pipeline fills "
            "and drains, so it is idle (P - 1)/(M + P - 1) of the step: 3/11. The 3/8 is the "
            "same idle time divided by the ideal compute, not by the step."),
    Prediction(
        key="04.peak-1f1b",
        question="4 stages, 8 microbatches: how many microbatches' activations does stage 0 "
                 "hold at its peak, under GPipe and under 1F1B?",
        choices=("GPipe 8, 1F1B 8: the same work keeps the same activations",
                 "GPipe 8, 1F1B 4",
                 "GPipe 8, 1F1B 1: one forward, one backward",
                 "GPipe 4, 1F1B 1"),
        answer=1,
        why="GPipe runs all 8 forwards before stage 0's first backward. Under 1F1B stage 0 "
            "runs P - 1 = 3 warm-up forwards and one more before the first gradient comes "
            "back; from then on every forward is paired with a backward that frees one, so "
            "it never holds more than P = 4."),
    Prediction(
        key="04.memory-1f1b",
        question="One training step, 4 stages, 8 microbatches, through the executor: the "
                 "1F1B schedule has at most 4 microbatches in flight on dev 0, GPipe 8. Dev "
                 "0's peak memory (parameters, gradients and activations) under 1F1B is:",
        choices=("exactly half of GPipe's",
                 "more than half of GPipe's, less than all of it",
                 "about the same as GPipe's",
                 "less than half of GPipe's"),
        answer=1,
        why="Only the activations shrink, from 8 microbatches' to 4; the parameters and "
            "their gradients stay on the device whatever the schedule. Here they are about a "
            "ninth of GPipe's peak, so 1F1B's peak is a little over half of it; the "
            "more the activations weigh (long sequences, big microbatches), the closer it "
            "gets to half."),
)

LESSON = Lesson(4, 'pipeline', 'ex04_pipeline', 'notebooks/04_pipeline.ipynb', EXERCISES,
                PREDICTIONS, drives_demos=('4.1', '4.2', '4.3', '4.5'))
