"""What kbbot says in its own words, in the user's language: the one catalogue of every platform.

Adapters format these words for their platform (Slack mrkdwn, Telegram entities) and fill in what
differs by platform (``{commands}``, ``{admins}``, ``{reviewers}``: how the platform names its commands
and settings). Review and admin results have a key per status: ``review_{ReviewStatus}`` and
``admin_{AdminStatus}`` (``bot.conversation``).

Admins' ``/status`` and ``/refresh`` replies are in the admin's language; what goes out with no one
asking (the golden set's alert to reviewers, the weekly digest, owners' lists, a re-check's
notification) is in English (``language="en"``), as before: its readers' languages are not known.
Words a source or the model supplies (a failure's reason, a service's state) stay as they come.
"""

from __future__ import annotations

MESSAGES: dict[str, dict[str, str]] = {
    "not_found": {
        "en": "I could not find this in the knowledge base, so I cannot answer it reliably. "
              "Please rephrase the question with the product model or fault code, or contact the service team.",
        "zh": "知识库中没有找到与这个问题相关的内容，因此无法给出可靠的回答。"
              "请补充产品型号或故障代码后重新提问，或联系售后服务团队。",
    },
    "ask_in_dm": {
        "en": "Some documents I may not use where others see my answer may hold it: ask me in a direct message.",
        "zh": "某些文档可能包含答案，但在他人可见的对话中我不能使用：请通过私信向我提问。",
    },
    "unmapped_identity": {
        "en": "I could not match you to an account of the knowledge sources, so I answer from public documents "
              "only. An administrator can map you (permissions.principals).",
        "zh": "无法将您对应到知识来源中的账号，因此我只根据公开文档回答。管理员可以为您配置映射（permissions.principals）。",
    },
    "off_topic": {
        "en": "That is outside what I can help with. I answer questions from the company knowledge base about: {subjects}.",
        "zh": "这个问题超出了我的服务范围。我只根据公司知识库回答以下方面的问题：{subjects}。",
    },
    "clarify": {
        "en": "The answer depends on the model. Which one do you mean: {candidates}?",
        "zh": "答案因型号而异。请问您指的是哪个型号：{candidates}？",
    },
    "cached_label": {
        "en": "✅ Previously approved answer (a reviewer confirmed it; ask again starting with !fresh for a new one):",
        "zh": "✅ 这是经审核确认过的回答（如需重新生成，请在问题前加 !fresh）：",
    },
    "cached_label_by": {
        "en": "✅ Previously approved answer (approved by {who} on {date}; ask again starting with !fresh "
              "for a new one):",
        "zh": "✅ 这是经审核确认过的回答（由 {who} 于 {date} 确认；如需重新生成，请在问题前加 !fresh）：",
    },
    "stale_notice": {
        "en": "⚠️ Note: a source cited here changed while this answer was written; check the current document.",
        "zh": "⚠️ 注意：本回答引用的资料在生成过程中已更新，请以最新文档为准。",
    },
    "empty_question": {
        "en": "Please type a question, for example: “How often should the bearings be greased?”",
        "zh": "请输入一个问题，例如：“电机过热怎么办？”",
    },
    "too_long": {
        "en": "That message is too long ({length} characters; the limit is {limit}). Please ask a shorter question.",
        "zh": "消息太长（{length} 个字符，上限为 {limit}）。请缩短问题后再问。",
    },
    "rate_limited_user": {
        "en": "You are asking faster than I can answer ({limit} questions per {window}). "
              "Please wait {seconds} s and ask again.",
        "zh": "提问过于频繁（每{window_zh}最多 {limit} 个问题）。请等待 {seconds} 秒后再问。",
    },
    "rate_limited_channel": {
        "en": "This conversation is asking faster than I can answer ({limit} questions per {window}). "
              "Please wait {seconds} s and ask again.",
        "zh": "此会话提问过于频繁（每{window_zh}最多 {limit} 个问题）。请等待 {seconds} 秒后再问。",
    },
    "busy": {
        "en": "I am answering many questions right now. Please ask again in a moment.",
        "zh": "当前提问较多，请稍后再问。",
    },
    "model_unavailable": {
        "en": "The language model is not answering right now ({reason}). Please try again in a minute.",
        "zh": "语言模型暂时无法响应（{reason}）。请稍后再试。",
    },
    "model_empty": {
        "en": "The language model returned an empty answer. Please try again.",
        "zh": "语言模型返回了空回答，请重试。",
    },
    "store_unavailable": {
        "en": "The knowledge base cannot be reached right now ({reason}). Please try again shortly.",
        "zh": "暂时无法访问知识库（{reason}）。请稍后再试。",
    },
    "state_unavailable": {
        "en": "kbbot cannot reach its conversation store right now ({reason}). Please try again shortly.",
        "zh": "暂时无法访问会话存储（{reason}）。请稍后再试。",
    },
    "internal": {
        "en": "Something went wrong while answering (reference {turn_id}). Please try again.",
        "zh": "回答时出现错误（编号 {turn_id}）。请重试。",
    },
    "timeout": {
        "en": "Answering took too long (over {seconds:.0f} s) and was stopped. Please try again.",
        "zh": "回答超时（超过 {seconds:.0f} 秒）已停止，请重试。",
    },
    # --- chat platforms: help, commands, clicks ------------------------------------------------------
    "help": {
        "en": ("Hi! I am kbbot. I answer questions from the company knowledge base: products and models, "
               "fault codes, installation, maintenance, spare parts and warranty. Every answer lists its "
               "sources; when the knowledge base does not cover a question I say so instead of guessing.\n\n"
               "Ask in English or Chinese, e.g. “What does fault E-004 mean?”. I remember this "
               "conversation for follow-up questions; /new starts a fresh one. "
               "Rate answers with 👍 / 👎.\n\n"
               "How I answer you: /prefs concise|detailed|default, /prefs lang en|zh|auto, "
               "/prefs steps on|off|default (/prefs alone shows them). /remember on lets me pick up "
               "preferences you state in your messages (/remember off stops that); /forget clears them all. "
               "When the knowledge base later learns the answer to a question I could not answer, I come back "
               "to it here; /prefs followups off [here] stops that."),
        "zh": ("你好！我是 kbbot，根据公司知识库回答问题：产品与型号、故障代码、安装、维护保养、备件和保修。"
               "每个回答都会列出来源；知识库中没有的内容我会直接说明，不会猜测。\n\n"
               "可以用中文或英文提问，例如“故障代码 E-004 是什么意思？”。我会记住本次对话以便追问；"
               "发送 /new 开始新的对话。可以用 👍 / 👎 评价回答。\n\n"
               "回答方式：/prefs concise|detailed|default（简洁/详细/默认）、/prefs lang en|zh|auto、"
               "/prefs steps on|off|default（单独发送 /prefs 查看当前设置）。/remember on 允许我从您的消息中记下"
               "您明确提出的偏好（/remember off 停止）；/forget 全部清除。"
               "知识库补充了我未能回答的问题后，我会回到这里作答；发送 /prefs followups off [here] 可关闭。"),
    },
    "slack_usage": {
        "en": ("Usage: `/kbbot status` or `/kbbot refresh [SOURCE]` (admins); for everyone: "
               "`/kbbot prefs [concise|detailed|default | lang en|zh|auto | steps on|off|default | "
               "followups on|off [here]]`, `/kbbot remember on|off`, `/kbbot forget`."),
        "zh": ("用法：`/kbbot status` 或 `/kbbot refresh [SOURCE]`（管理员）；所有人可用："
               "`/kbbot prefs [concise|detailed|default | lang en|zh|auto | steps on|off|default | "
               "followups on|off [here]]`、`/kbbot remember on|off`、`/kbbot forget`。"),
    },
    "new": {
        "en": "Started a new conversation: earlier questions are forgotten.",
        "zh": "已开始新的对话，之前的问题不再作为上下文。",
    },
    "refused": {
        "en": "Sorry, you are not on the list of people kbbot may answer. Please ask your administrator for access.",
        "zh": "抱歉，您不在 kbbot 的可用用户名单中，请联系管理员开通权限。",
    },
    "not_allowed": {
        "en": "Sorry, kbbot does not answer in this workspace.",
        "zh": "抱歉，kbbot 不在此工作区提供回答。",
    },
    "crashed": {"en": "Something went wrong while answering. Please try again.",
                "zh": "回答时出现错误，请重试。"},
    "interrupted": {"en": "(This answer was interrupted; it continues below.)",
                    "zh": "（此回答已中断，完整回答见下方。）"},
    "sources": {"en": "Sources", "zh": "来源"},
    "searching": {"en": "Searching the knowledge base…", "zh": "正在检索知识库…"},
    "thanks": {"en": "Thanks for the feedback!", "zh": "感谢您的反馈！"},
    "feedback_failed": {"en": "Sorry, the feedback could not be saved.", "zh": "抱歉，反馈未能保存。"},
    "refreshing": {"en": "Refreshing {what} now; the result follows.", "zh": "正在刷新 {what}，完成后会发送结果。"},
    "every_source": {"en": "every source", "zh": "所有来源"},
    "admin_not_admin": {
        "en": "Sorry, {commands} are for kbbot admins only. Please ask whoever runs kbbot to add your user id "
              "to {admins}.",
        "zh": "抱歉，{commands} 仅供 kbbot 管理员使用。如需权限，请联系 kbbot 的管理员将您的用户 ID 加入 {admins}。",
    },
    "admin_unavailable": {"en": "Knowledge refresh is not available in this kbbot process.",
                          "zh": "此 kbbot 进程不支持知识库刷新。"},
    "admin_failed": {"en": "Sorry, that failed. The logs have the details.", "zh": "抱歉，操作失败，详情见日志。"},
    "approve": {"en": "✅ Approve", "zh": "✅ 批准"},
    "withdraw": {"en": "↩️ Withdraw approval", "zh": "↩️ 撤销批准"},
    "review_approved": {"en": "✅ Approved: the same question now gets this answer at once.",
                        "zh": "✅ 已批准：之后相同的问题会直接得到这个回答。"},
    "review_approved_by": {"en": "✅ Approved by {user}: the same question now gets this answer at once.",
                           "zh": "✅ 已由 {user} 批准：之后相同的问题会直接得到这个回答。"},
    "review_withdrawn": {"en": "Approval withdrawn: the question is answered afresh again.",
                         "zh": "已撤销批准：相同的问题将重新生成回答。"},
    "review_withdrawn_by": {"en": "Approval withdrawn by {user}: the question is answered afresh again.",
                            "zh": "{user} 已撤销批准：相同的问题将重新生成回答。"},
    "review_not_reviewer": {
        "en": "Sorry, only kbbot reviewers can approve answers or withdraw approvals. Please ask whoever runs "
              "kbbot to add your user id to {reviewers}.",
        "zh": "抱歉，只有 kbbot 审核人可以批准回答或撤销批准。如需权限，请联系 kbbot 的管理员将您的用户 ID 加入 {reviewers}。",
    },
    "review_expired": {
        "en": "This answer can no longer be approved: approval is open for a limited time after an answer is "
              "sent, and only for the first answer of a conversation. Ask again to get a new one.",
        "zh": "这个回答已无法批准：回答发送后只在有限时间内可以批准，且仅限对话中的第一个回答。请重新提问。",
    },
    "review_nothing_to_withdraw": {
        "en": "There is no approval of this answer to withdraw (it was already withdrawn, or the knowledge base "
              "changed since).",
        "zh": "这个回答没有可撤销的批准（已被撤销，或知识库已更新）。",
    },
    "review_disabled": {"en": "Approved answers are turned off (approvals.enabled).",
                        "zh": "已关闭批准回答功能（approvals.enabled）。"},
    # --- approved answers re-checked after a refresh (bot.knowledge.loop.recheck) ---------------------------------
    "keep_approved": {"en": "✅ Keep approved", "zh": "✅ 保持批准"},
    "retire": {"en": "🗑 Retire", "zh": "🗑 停用"},
    "recheck_head": {"en": "An approved answer's sources changed in a refresh. Question: {question}",
                     "zh": "一个已批准回答的来源在刷新中发生了变化。问题：{question}"},
    "recheck_old": {"en": "Approved answer (by {who}), no longer served until you decide:",
                    "zh": "已批准的回答（由 {who} 批准），在您决定之前不再提供："},
    "recheck_new": {"en": "The answer on the new knowledge (version {version}):",
                    "zh": "基于新知识（版本 {version}）的回答："},
    "recheck_unanswered": {"en": "The knowledge base no longer answers it ({outcome}): it can only be retired.",
                           "zh": "知识库已无法回答该问题（{outcome}）：只能停用。"},
    "review_kept": {"en": "✅ Kept approved: the new answer is given from now on.",
                    "zh": "✅ 已保持批准：今后将提供新的回答。"},
    "review_kept_by": {"en": "✅ Kept approved by {user}: the new answer is given from now on.",
                       "zh": "✅ 已由 {user} 保持批准：今后将提供新的回答。"},
    "review_retired": {"en": "🗑 Retired: the question is answered afresh.",
                       "zh": "🗑 已停用：该问题将重新生成回答。"},
    "review_retired_by": {"en": "🗑 Retired by {user}: the question is answered afresh.",
                          "zh": "🗑 已由 {user} 停用：该问题将重新生成回答。"},
    "review_not_held": {"en": "Nothing waits for a decision here any more (already kept or retired).",
                        "zh": "这里已没有待决定的内容（已保持或已停用）。"},
    "review_failed": {"en": "Sorry, that could not be saved right now. Please try again.",
                      "zh": "抱歉，暂时无法保存，请重试。"},
    # --- preference commands (bot.preference_commands) ---------------------------------------------
    "prefs_now": {
        "en": "Your answering preferences (for your questions in every thread here): {described}.",
        "zh": "您的回答偏好（适用于您在这里所有对话中的提问）：{described}。",
    },
    "prefs_remember_on": {
        "en": "OK: from now on I may pick up answering preferences you state in your messages "
              "(for example “please keep it short”). {prefix}remember off stops that and clears what I learned.",
        "zh": "好的：今后我会从您的消息中记下您明确提出的回答偏好（例如“请简短回答”）。"
              "发送 {prefix}remember off 可停止并清除已记下的内容。",
    },
    "prefs_remember_off": {
        "en": "OK: I stopped learning from your messages and cleared what I had learned. "
              "Preferences you set with {prefix}prefs stay.",
        "zh": "好的：已停止从您的消息中学习，并清除了已记下的偏好。用 {prefix}prefs 设置的偏好仍然保留。",
    },
    "prefs_follow_ups_on": {
        "en": "OK: when the knowledge base later learns the answer to a question I could not answer, I will "
              "answer it in its thread. {prefix}prefs followups off [here] stops that.",
        "zh": "好的：知识库补充了我之前未能回答的问题后，我会在原对话中回复。发送 {prefix}prefs followups off [here] 可关闭。",
    },
    "prefs_follow_ups_off": {
        "en": "OK: I will not come back to your unanswered questions when the knowledge base learns the answer. "
              "{prefix}prefs followups on turns it back on.",
        "zh": "好的：知识库补充后，我不会再回复您之前未答的问题。发送 {prefix}prefs followups on 可重新开启。",
    },
    "prefs_follow_ups_on_here": {
        "en": "OK: in this channel I will answer your unanswered questions once the knowledge base covers them.",
        "zh": "好的：在此会话中，知识库补充后我会回复您之前未答的问题。",
    },
    "prefs_follow_ups_off_here": {
        "en": "OK: in this channel I will not come back to your unanswered questions. "
              "{prefix}prefs followups on here turns it back on.",
        "zh": "好的：在此会话中，知识库补充后我不会再回复您之前未答的问题。发送 {prefix}prefs followups on here 可重新开启。",
    },
    "gap_closed": {
        "en": "📚 The knowledge base now covers a question asked here on {date}: “{question}”",
        "zh": "📚 知识库现在可以回答 {date} 在这里提出的问题：“{question}”",
    },
    "expert_answer": {
        "en": "💬 Answer by {author}, given in the thread where this was asked on {date}:\n\n{text}",
        "zh": "💬 以下回答来自 {author}（{date} 在提问的对话中回复）：\n\n{text}",
    },
    "expert_offer": {
        "en": "💬 {author} replied after kbbot could not answer “{question}”. Keep the reply?",
        "zh": "💬 {author} 在 kbbot 未能回答“{question}”之后做了回复。是否保留这条回复？",
    },
    "expert_too_long": {
        "en": "Your reply is longer than {limit} characters, so it cannot be offered to the reviewers as the answer "
              "(they would not see all of it). Please reply again more briefly, or ask an editor to add it to the "
              "knowledge base.",
        "zh": "你的回复超过 {limit} 个字符，无法作为答案提交给审核人（他们无法看到全文）。请更简短地再回复一次，"
              "或请编辑将其加入知识库。",
    },
    "expert_approve": {"en": "Save as approved answer", "zh": "保存为已批准回答"},
    "expert_capture": {"en": "Add to the knowledge base", "zh": "加入知识库"},
    "expert_done_approve": {
        "en": "Saved: “{detail}” is now answered with this reply (approved by {user}).",
        "zh": "已保存：“{detail}”今后将以这条回复作答（由 {user} 批准）。",
    },
    "expert_done_capture": {
        "en": "Added to the knowledge base: {detail} (indexed on the source's next refresh).",
        "zh": "已加入知识库：{detail}（在该来源下次刷新时建立索引）。",
    },
    "expert_already": {"en": "Already done by {detail}.", "zh": "{detail} 已经处理过了。"},
    "expert_not_reviewer": {"en": "Only reviewers ({reviewers}) can keep replies.",
                            "zh": "只有审核人（{reviewers}）可以保留回复。"},
    "expert_expired": {
        "en": "This reply can no longer be kept (it expired, or the knowledge base changed since; ask again).",
        "zh": "这条回复已无法保留（已过期，或知识库已更新）。",
    },
    "expert_disabled": {
        "en": "That is turned off here (approvals.enabled, insights.capture_source).",
        "zh": "此功能未开启（approvals.enabled、insights.capture_source）。",
    },
    "expert_failed": {"en": "Sorry, that could not be saved right now. Please try again.",
                      "zh": "抱歉，暂时无法保存，请重试。"},
    "prefs_forgot": {
        "en": "Done: I forgot your answering preferences and everything I had learned about them, "
              "and deleted the record of your questions.",
        "zh": "已完成：您的回答偏好以及从消息中学到的内容都已清除，您提问的记录也已删除。",
    },
    "prefs_usage": {
        "en": "Usage: {prefix}prefs concise|detailed|default · {prefix}prefs lang en|zh|auto · "
              "{prefix}prefs steps on|off|default · {prefix}prefs followups on|off [here] · "
              "{prefix}remember on|off · {prefix}forget",
        "zh": "用法：{prefix}prefs concise|detailed|default（简洁/详细/默认）· {prefix}prefs lang en|zh|auto"
              "（英文/中文/随提问）· {prefix}prefs steps on|off|default（步骤编号）· "
              "{prefix}prefs followups on|off [here]（知识库补充后是否回复未答问题）· "
              "{prefix}remember on|off（是否从消息中学习偏好）· {prefix}forget（全部清除）",
    },
    "prefs_failed": {
        "en": "Sorry, your preferences could not be saved right now. Please try again in a minute.",
        "zh": "抱歉，暂时无法保存您的偏好，请稍后再试。",
    },
    "prefs_unavailable": {
        "en": "Answering preferences are not available in this kbbot process.",
        "zh": "此 kbbot 进程不支持回答偏好设置。",
    },
    # --- admins' /status and /refresh (bot.knowledge.scheduler.KnowledgeAdmin, bot.knowledge.refresh) --------------------------
    "admin_no_sources": {"en": "No sources are configured.", "zh": "未配置任何来源。"},
    "admin_unknown_source": {"en": "There is no source named “{name}”. Sources: {sources}.",
                             "zh": "没有名为“{name}”的来源。现有来源：{sources}。"},
    "refresh_busy": {"en": "{source}: not refreshed: {reason}; try again later.",
                     "zh": "{source}：未刷新：{reason}；请稍后再试。"},
    "failed_line": {"en": "    failed: {source}: {reason}", "zh": "    失败：{source}：{reason}"},
    "failed_more": {"en": "    … and {count} more", "zh": "    … 另有 {count} 个"},
    "run_counts": {"en": "{added} new, {changed} changed, {removed} removed, {unchanged} unchanged, {failed} failed",
                   "zh": "新增 {added}，更改 {changed}，删除 {removed}，未变 {unchanged}，失败 {failed}"},
    "run_disallowed": {"en": ", {count} disallowed by robots.txt", "zh": "，{count} 个被 robots.txt 禁止"},
    "run_orphaned": {"en": ", {count} removed with a source no longer configured",
                     "zh": "，{count} 个因其来源不再配置而删除"},
    "run_permissions": {"en": ", {count} with new permissions", "zh": "，{count} 个权限已更新"},
    "run_held": {"en": ", {count} held back (readable by nobody)", "zh": "，{count} 个被暂扣（无人可读）"},
    "run_ok": {"en": "refreshed in {seconds:.1f} s: {counts}", "zh": "刷新完成，用时 {seconds:.1f} 秒：{counts}"},
    "run_failed": {"en": "refresh failed after {seconds:.1f} s ({error}); so far {counts}",
                   "zh": "刷新失败，用时 {seconds:.1f} 秒（{error}）；此前 {counts}"},
    "run_version": {"en": "; knowledge version {version}", "zh": "；知识版本 {version}"},
    "status_version": {"en": "Knowledge version {version}", "zh": "知识版本 {version}"},
    "status_no_sources": {"en": "No sources are configured (sources: in the settings file).",
                          "zh": "未配置任何来源（设置文件中的 sources:）。"},
    "status_source": {"en": "• {name}: {documents} documents, {chunks} chunks",
                      "zh": "• {name}：{documents} 个文档，{chunks} 个分块"},
    "status_last_run": {"en": "; last run {when} ({trigger}): {outcome}", "zh": "；上次运行 {when}（{trigger}）：{outcome}"},
    "status_never_refreshed": {"en": "; never refreshed", "zh": "；从未刷新"},
    "status_next_run": {"en": "; next run {when}", "zh": "；下次运行 {when}"},
    "status_held": {"en": "    {count} documents held back (readable by nobody)",
                    "zh": "    {count} 个文档被暂扣（无人可读）"},
    "status_permissions_run": {"en": "    permissions alone read {when} ({trigger}): {outcome}",
                               "zh": "    仅读取权限 {when}（{trigger}）：{outcome}"},
    # --- the golden set (bot.knowledge.loop.golden): the status's line and the reviewers' alert ---------------
    "golden_replayed": {"en": "golden set replayed {when} (knowledge version {version}): {passed} passed, {failed} failed",
                        "zh": "黄金测试集于 {when} 重放（知识版本 {version}）：通过 {passed}，失败 {failed}"},
    "status_golden_replayed": {
        "en": "Golden set: replayed {when} (knowledge version {version}): {passed} passed, {failed} failed",
        "zh": "黄金测试集：于 {when} 重放（知识版本 {version}）：通过 {passed}，失败 {failed}",
    },
    "golden_failed_case": {"en": "  failed: {question}: {why}", "zh": "  失败：{question}：{why}"},
    "status_golden_pending": {
        "en": "Golden set: {path}, not replayed yet (after the next refresh that changes documents)",
        "zh": "黄金测试集：{path}，尚未重放（将在下次更改文档的刷新之后重放）",
    },
    "status_golden_none": {"en": "Golden set: none (no approvals.golden_file)",
                           "zh": "黄金测试集：无（未设置 approvals.golden_file）"},
    "golden_alert": {"en": "kbbot: the golden set fails after a refresh.\n{summary}",
                     "zh": "kbbot：刷新后黄金测试集未通过。\n{summary}"},
    # --- reviewers: the notification of a re-check (adapters.slack.loop) -----------------------------------
    "recheck_notice": {"en": "Re-check an approved answer: {question}", "zh": "请复核一个已批准的回答：{question}"},
    # --- documents' owners: their gaps of the week (bot.knowledge.loop.owners) -------------------------------
    "owners_head": {
        "en": "kbbot: questions people asked this week ({since} – {until}) that the knowledge base could not answer, "
              "nearest to documents you own. Adding the answer there lets kbbot answer them:",
        "zh": "kbbot：本周（{since} – {until}）知识库未能回答、且与您负责的文档最相关的问题。"
              "在这些文档中补充答案后，kbbot 就能回答它们：",
    },
    "owners_gap": {"en": "{number}. {question} — asked {count}×", "zh": "{number}. {question} — 被问 {count} 次"},
    "owners_withheld": {"en": "   closest: a document you may not read (withheld)",
                        "zh": "   最接近：一份您无权阅读的文档（已隐去）"},
    "owners_closest": {"en": "   closest: {title} ({source}): {excerpt}", "zh": "   最接近：{title}（{source}）：{excerpt}"},
    # --- the weekly digest (bot.knowledge.insights.digest) ---------------------------------------------------------------
    "digest_head": {"en": "kbbot weekly digest ({since} – {until})", "zh": "kbbot 每周摘要（{since} – {until}）"},
    "digest_counts": {"en": "{turns} questions, {rate} answered, {up} 👍 / {down} 👎.",
                      "zh": "共 {turns} 个问题，已回答 {rate}，{up} 👍 / {down} 👎。"},
    "digest_top": {"en": "Top unanswered questions:", "zh": "未回答的主要问题："},
    "digest_no_other": {"en": "No other unanswered questions.", "zh": "没有其他未回答的问题。"},
    "digest_all_answered": {"en": "Every question this week was answered.", "zh": "本周所有问题都已回答。"},
    "digest_gap": {"en": "{number}. {question} — asked {count}×{similar} in {channels}",
                   "zh": "{number}. {question} — 在 {channels} 被问 {count} 次{similar}"},
    "digest_similar": {"en": " (+{count} similar)", "zh": "（另有 {count} 个相似问题）"},
    "digest_private": {
        "en": "({count} more group{s} of unanswered questions asked in direct messages, not shown here.)",
        "zh": "（另有 {count} 组未回答的问题是在私信中提出的，此处不显示。）",
    },
    "digest_to_owners": {"en": "({count} more groups went to the owners of their nearest documents.)",
                         "zh": "（另有 {count} 组已发送给最相关文档的负责人。）"},
    "digest_closed": {
        "en": "{count} earlier question{s} answered where asked once a refresh brought the answer (gaps closed).",
        "zh": "{count} 个之前未答的问题在刷新带来答案后已在原处回答（空白已补上）。",
    },
    "digest_disliked": {"en": "👎 answers:", "zh": "被点 👎 的回答："},
    "digest_sources": {"en": "Sources needing attention: {sources}", "zh": "需要关注的来源：{sources}"},
    "digest_details": {"en": "Details: {url}", "zh": "详情：{url}"},
}


def say(key: str, language: str, **values: object) -> str:
    """The words of ``key`` in ``language`` (English when there is no translation), ``values`` filled in."""
    table = MESSAGES[key]
    return table.get(language, table["en"]).format(**values)
