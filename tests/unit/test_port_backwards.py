"""Two backward() calls through one forward of a wrapped model: detached for the first where the original discards
the model's gradients from it, else a TODO naming both."""

from __future__ import annotations

import textwrap

from ddpkit.port import port_source

_HEAD = """\
    import torch
    from torch import nn


    def penalty(critic, real, fake):
        mixed = real * 0.5 + fake * 0.5
        score = critic(mixed)
        grad = torch.autograd.grad(outputs=score, inputs=mixed, grad_outputs=torch.ones_like(score),
                                   create_graph=True)[0]
        return ((grad.norm(2, dim=1) - 1) ** 2).mean()


    gen = nn.Linear(2, 4)
    critic = nn.Linear(4, 1)
    gen_optim = torch.optim.Adam(gen.parameters(), lr=1e-3)
    critic_optim = torch.optim.Adam(critic.parameters(), lr=1e-3)
    data = torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=8, shuffle=True)
    for real in data:
        for _ in range(3):
            z = torch.randn(real.shape[0], 2)
            fake = gen(z)
            critic_loss = critic(fake).mean() - critic(real).mean() + 10 * penalty(critic, real, fake)
            critic.zero_grad()
            critic_loss.backward(retain_graph=True)
            critic_optim.step()
"""


def test_an_output_both_backwards_run_through_is_detached_for_the_first_when_its_gradients_are_discarded():
    source = textwrap.dedent(_HEAD + """\
        gen_loss = -critic(fake).mean()
        gen.zero_grad()
        gen_loss.backward()
        gen_optim.step()
    """)
    result = port_source(source)
    code = result.code
    # the critic's loss no longer runs back into gen: gen_loss.backward() is the one that reduces gen's gradients
    assert "critic_loss = critic(fake.detach()).mean() - critic(real).mean() + 10 * penalty(critic, real, " \
           "fake.detach().requires_grad_())" in code, code
    assert "gen_loss = -critic(fake).mean()" in code
    assert "is detached where only `critic_loss` reads it" in code
    assert not any("runs back through" in t.message for t in result.todos)


def test_a_step_on_the_first_backwards_gradients_leaves_a_todo_naming_both():
    source = textwrap.dedent(_HEAD + """\
            gen_optim.step()
        gen_loss = -critic(fake).mean()
        gen.zero_grad()
        gen_loss.backward()
        gen_optim.step()
    """)
    result = port_source(source)
    assert "fake.detach()" not in result.code
    found = [t.message for t in result.todos if "runs back through `fake`" in t.message]
    assert found and "`critic_loss.backward()`" in found[0] and "wrapped `gen`" in found[0], \
        [t.message[:80] for t in result.todos]


def test_a_new_forward_between_the_backwards_is_left_alone():
    source = textwrap.dedent(_HEAD + """\
        fake = gen(torch.randn(real.shape[0], 2))
        gen_loss = -critic(fake).mean()
        gen.zero_grad()
        gen_loss.backward()
        gen_optim.step()
    """)
    result = port_source(source)
    assert "fake.detach()" not in result.code
    assert not any("runs back through" in t.message for t in result.todos)


def test_a_first_backward_that_frees_its_graph_or_a_new_leaf_between_is_left_alone():
    # without retain_graph the original could not run back through `fake` twice: the second loss reaches it
    # through `Variable(...)`, a new leaf, which this pass must see as the end of the graph
    source = textwrap.dedent(_HEAD.replace("critic_loss.backward(retain_graph=True)", "critic_loss.backward()") + """\
        mixed = torch.autograd.Variable(fake * 0.5, requires_grad=True)
        gen_loss = -critic(mixed).mean()
        gen.zero_grad()
        gen_loss.backward()
        gen_optim.step()
    """)
    result = port_source(source)
    assert "fake.detach()" not in result.code
    assert not any("runs back through" in t.message for t in result.todos)
