"""The authorization webhook: SubjectAccessReviews answered from a policy over the
identity in the review (docs/authorization.md).

``sar`` (the wire format), ``keystone_policy`` (k8s-keystone-auth's policy file, read
as is), ``own_rules`` (the gateway's own rules), ``rules`` (a policy: rules in order,
first match decides), ``source`` (the policy in force, reloaded on change), ``cache``
(decisions kept, as kube-apiserver keeps them), ``webhook`` (a body in, an answer out),
``metrics``. Its config section is authn_gateway/config/authorization.py.
"""
